"""The command line: `python -m hack.devcluster up|down|status|kubeconfig|load-images`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .health import _cluster_from_state
from .images import _built_image_archives, load_images
from .lifecycle import down, status, up
from .lws import start_lws
from .state import DEFAULT_NAME, ClusterError, _read_state, cluster_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.devcluster", description="A local Kubernetes control plane with simulated 8-GPU nodes.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("up", "start the cluster (or reuse it) and print its kubeconfig path"),
        ("down", "stop the cluster; --purge also forgets its certificates and ports"),
        ("status", "show the components and their health"),
        ("kubeconfig", "print the kubeconfig path"),
        ("load-images", "import image archives (OCI or Docker) into the real node's containerd"),
    ):
        command_parser = sub.add_parser(command, help=help_text)
        command_parser.add_argument("--name", default=os.environ.get("SPECDEC_CLUSTER_NAME", DEFAULT_NAME))
        if command == "up":
            command_parser.add_argument(
                "--real-node", action="store_true", help="add one real node (containerd, kubelet, kube-proxy, CoreDNS) beside the kwok nodes"
            )
            command_parser.add_argument(
                "--lws", action="store_true", help="also run the LeaderWorkerSet controller (hack/tools.sh lws) for multi-node servers"
            )
            command_parser.add_argument(
                "--load-images",
                nargs="*",
                metavar="ARCHIVE",
                default=None,
                help="with --real-node: image archives to import (default: those make images-local wrote)",
            )
        if command == "load-images":
            command_parser.add_argument("archives", nargs="+", metavar="ARCHIVE")
        if command == "down":
            command_parser.add_argument("--purge", action="store_true")
        if command == "status":
            command_parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"devcluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.command == "up":
            cluster = up(args.name, log=say, real_node=args.real_node)
            if args.lws:
                start_lws(cluster, log=say)
            if args.real_node and args.load_images is not None:
                archives = args.load_images or _built_image_archives()
                if not archives:
                    say("real node: no image archives to import yet (make images-local builds them)")
                for image in load_images(cluster, archives):
                    say(f"real node: image {image} imported")
            nodes = cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.family").stdout
            print(nodes.rstrip(), file=sys.stderr)
            say(f"kubeconfig: {cluster.kubeconfig}")
            say(f"use it with: export KUBECONFIG={cluster.kubeconfig}")
            print(cluster.kubeconfig)
        elif args.command == "down":
            was_running = down(args.name, purge=args.purge)
            say(f"cluster {args.name!r} {'stopped' if was_running else 'was not running'}" + (" and purged" if args.purge else ""))
        elif args.command == "status":
            report = status(args.name)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                print(f"cluster {report['name']}: {report['state']}  kubeconfig: {report['kubeconfig']}")
                for component, info in report["components"].items():
                    health = "healthy" if info["healthy"] else ("running" if info["pid"] else "stopped")
                    print(f"  {component:<24} {health:<8} pid={info['pid'] or '-'} port={info['port']}")
            return 0 if report["state"] == "up" else 1
        elif args.command == "load-images":
            state = _read_state(args.name)
            if not state.get("ports"):
                raise ClusterError(f"cluster {args.name!r} is not running")
            for image in load_images(_cluster_from_state(args.name, state), args.archives):
                say(f"imported {image}")
        elif args.command == "kubeconfig":
            print(cluster_dir(args.name) / "kubeconfig")
    except ClusterError as error:
        print(f"devcluster: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
