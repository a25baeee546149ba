#!/usr/bin/env bash
# Build (or refresh) both venvs and prepare the default model. Idempotent: a venv is
# rebuilt only when its requirements file changed; the plugin is (re)installed
# editable from this checkout every time, which takes a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${MARLAAS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/areal-marlaas}
py=${MARLAAS_PYTHON:-python3.11}
areal_venv=${MARLAAS_AREAL_VENV:-$cache/venv-areal}
vllm_venv=${MARLAAS_VLLM_VENV:-$cache/venv-vllm}
mkdir -p "$cache"

stamp_of() { sha256sum "$1" | cut -c1-16; }

build_venv() {  # build_venv DIR REQUIREMENTS [post-step...]
  local dir=$1 req=$2 want
  want=$(stamp_of "$req")
  if [[ -f $dir/.marlaas-stamp && $(cat "$dir/.marlaas-stamp") == "$want" ]]; then
    echo "[setup] $dir is up to date"
    return 0
  fi
  echo "[setup] building $dir from $req (several minutes on first use)"
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  "$dir/bin/pip" install -q -r "$req"
  shift 2
  if [[ $# -gt 0 ]]; then "$@"; fi
  echo "$want" >"$dir/.marlaas-stamp"
}

drop_av_packages() {
  # PyPI's torchvision/torchaudio/torchcodec fail to import beside the CPU torch
  # ("operator torchvision::nms does not exist"); text models never need them.
  "$vllm_venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
}

build_venv "$areal_venv" "$here/requirements/areal.txt" &
areal_pid=$!
build_venv "$vllm_venv" "$here/requirements/vllm.txt" drop_av_packages &
vllm_pid=$!
wait $areal_pid
wait $vllm_pid

# The dashboard's bundle is package data: built before the editable install.
bash "$here/scripts/build_dashboard.sh"
bash "$here/scripts/browser.sh"

# The build backend warns about editable installs at every run: nothing to act on.
PYTHONWARNINGS=ignore "$areal_venv/bin/pip" install -q -e "$here"
"$areal_venv/bin/marlaas" prepare-model
echo "[setup] AReaL venv: $areal_venv"
echo "[setup] vLLM venv:  $vllm_venv"
