"""`python -m train ...` is `melshards train ...`."""
from train.run import main

main()
