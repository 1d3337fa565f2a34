"""specdec-operator: safe speculative decoding on Kubernetes.

The package lives under operator/ (a source root without __init__.py, so the standard library's
`operator` module is never shadowed).
"""

__version__ = "0.1.0"

API_GROUP = "specdec.io"
API_VERSION = "v1alpha1"
KIND = "SpeculativeServer"
PLURAL = "speculativeservers"

# The SGLang release this package is written against: the validator's tables (validator/tables.py) are read
# from it, it is the default spec.sglangVersion, and `make test` installs its wheel (the Makefile's copy is
# kept equal by tests/unit/test_sglang_version.py).
SGLANG_VERSION = "0.5.23"
