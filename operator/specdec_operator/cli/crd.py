"""`specdec crd`: print the SpeculativeServer CRD (or its Markdown field reference) generated from the API models."""

from __future__ import annotations

import argparse
import sys

from ..crd import custom_resource_definition, render_reference, render_yaml


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specdec crd", description="Print the SpeculativeServer CRD generated from the API models.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    parser.add_argument("--reference", action="store_true", help="print the Markdown field reference (docs/api.md)")
    args = parser.parse_args(argv)
    if args.reference:
        sys.stdout.write(render_reference())
    elif args.json:
        import json

        json.dump(custom_resource_definition(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_yaml())
    return 0
