// Command coredns is CoreDNS v1.14 with only the plugins the real node's cluster DNS uses: bind, kubernetes (Services
// and pods of cluster.local), errors, log, health, ready, cache, loadbalance. Importing coremain without
// core/plugin keeps the dozens of cloud plugins (and their SDKs) out of the build; this is CoreDNS' documented
// way of embedding it with a chosen plugin set, and it reads the same Corefile syntax.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
