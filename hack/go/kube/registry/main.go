// Command registry is the CNCF distribution registry (github.com/distribution/distribution/v3, cmd/registry) with only
// the filesystem and in-memory storage drivers and htpasswd authentication: the release test
// (tests/cluster/test_realnode_e2e.py, through tests/support/registry.py) runs it on 127.0.0.1 with a temporary
// directory as its storage and a user, so that pulls need credentials (the pods' imagePullSecrets). Leaving out the
// S3, Azure and GCS drivers keeps their SDKs out of the build; the command line and configuration file are upstream's
// (`registry serve CONFIG`). It builds in this module, in the same `go build` as the control plane: distribution
// v3.1.1 is already in this module's graph (through helm), and adding it moved none of the versions the other tools
// build with, so its grpc, otel and protobuf packages are the ones the API server compiles anyway.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
