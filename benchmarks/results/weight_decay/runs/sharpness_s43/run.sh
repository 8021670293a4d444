#!/usr/bin/env bash
# Session 43: Recover's doubling of L kept as `sharpness` (constants.py, eq. sharpness; not
# merged: sharpness.patch here, applied to a checkout of 24e0c3b) against today's default
# (../final_s43): the same runs, from that checkout, into this folder.
# usage: CODE=<checkout with sharpness.patch applied> bash run.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=$here exec bash "$here/../final_s43/run.sh" "$@"
