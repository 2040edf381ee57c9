"""The contracts between the driver (fleet/) and the engines (actors/): manifest value types,
Arrow schemas, and what engines take and return.

This package imports nothing else of the project (the import checker in .ci/run enforces it),
so both sides can depend on it without depending on each other.
"""
