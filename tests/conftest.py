"""Puts tests/ on sys.path so every test folder can import the shared ``numerics`` helpers."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
