"""Shim over setup.cfg: Dataflow's --setup_file builds the workers' package from it."""

import setuptools

setuptools.setup()
