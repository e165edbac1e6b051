#!/usr/bin/env bash
# Installs the Debian 12 packages trex needs, only those missing (quiet and fast when all are there).
set -euo pipefail
pkgs=(build-essential clang libcjson-dev libglpk-dev glpk-utils coinor-libcbc-dev libpcre2-dev
      libopenmpi-dev openmpi-bin libdnnl-dev python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Node.js and npm run the tokenizer parity test's oracle (the Hugging Face tokenizers library);
# a machine that already has them from elsewhere keeps its own.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
