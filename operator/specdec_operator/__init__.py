"""specdec-operator: safe speculative decoding on Kubernetes.

The package lives under operator/ (a source root without __init__.py, so the standard library's
`operator` module is never shadowed).
"""

__version__ = "0.1.0"

API_GROUP = "specdec.io"
API_VERSION = "v1alpha1"
KIND = "SpeculativeServer"
PLURAL = "speculativeservers"
