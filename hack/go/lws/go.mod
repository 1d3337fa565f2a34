// Consumer module that builds the LeaderWorkerSet controller (sigs.k8s.io/lws, its cmd/main.go) for multi-node
// servers (resources.nodes > 1). Kept apart from hack/go/kube: it follows its own controller-runtime. hack/tools.sh
// builds it as the optional group `lws`; hack/devcluster.py runs it against the local control plane.
module specdec.io/hack/lws

go 1.26.0

