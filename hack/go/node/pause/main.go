// Command pause is the real node's pod sandbox process: it holds the pod's namespaces, reaps orphaned children
// and exits 0 on SIGINT/SIGTERM. No registry is reachable here, so hack/devcluster packs this static binary
// into a one-layer OCI image itself and imports it into containerd as the CRI sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
