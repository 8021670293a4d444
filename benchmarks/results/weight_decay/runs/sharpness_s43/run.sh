#!/usr/bin/env bash
# Session 43: Recover's doubling of L kept as `sharpness` (constants.py, eq. sharpness; branch
# `sharpness`, not merged) against today's default (../final_s43): the same runs, from a checkout
# of that branch, into this folder.
# usage: CODE=<checkout of the sharpness branch> bash run.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=$here exec bash "$here/../final_s43/run.sh" "$@"
