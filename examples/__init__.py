"""Example model plug-ins for `melshards train --model examples.<module>:build` (run from the repository root)."""
