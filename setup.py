#!/usr/bin/env python
"""Thin setup.py: metadata lives in setup.cfg (the dask-jobqueue model)."""
from setuptools import setup

setup()
