"""Adapters: the ports implemented on Google Cloud client libraries, and in memory.

This package is the only code in opendws that imports ``google.*``.
"""
