#!/usr/bin/env bash
# What the real node needs from the machine, from Debian's packages: containerd 1.6, runc, the CNI plugins,
# iptables and conntrack; buildah and mmdebstrap build the images (make images-local). Installs what is missing
# (apt-get as root, through hack/apt-install.sh: one apt-get at a time); prints nothing and returns at once when all is there.
set -euo pipefail
declare -A need=([containerd]=containerd [runc]=runc [buildah]=buildah [mmdebstrap]=mmdebstrap
                 [iptables]=iptables [conntrack]=conntrack [/usr/lib/cni/bridge]=containernetworking-plugins)
missing=()
for tool in "${!need[@]}"; do
  if [[ "$tool" == /* ]]; then [[ -x "$tool" ]] || missing+=("${need[$tool]}")
  else command -v "$tool" >/dev/null 2>&1 || missing+=("${need[$tool]}"); fi
done
(( ${#missing[@]} )) || exit 0
exec "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" node-deps "${missing[@]}"
