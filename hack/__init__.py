"""Developer tooling (the local control plane, the demo, manifests); a package so tests import `hack.devcluster`."""
