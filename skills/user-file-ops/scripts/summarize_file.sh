#!/usr/bin/env bash
# Summarize a text file: line/word/byte counts and the first 20 non-empty lines.
set -euo pipefail

usage() {
    echo "usage: summarize_file.sh INPUT OUTPUT" >&2
    exit 2
}

[ "$#" -eq 2 ] || usage
input=$1
output=$2
[ -n "$input" ] && [ -n "$output" ] || usage
if [ ! -f "$input" ] || [ ! -r "$input" ]; then
    echo "summarize_file.sh: not a readable file: $input" >&2
    usage
fi

mkdir -p -- "$(dirname -- "$output")"

lines=$(wc -l < "$input" | tr -d '[:space:]')
words=$(wc -w < "$input" | tr -d '[:space:]')
bytes=$(wc -c < "$input" | tr -d '[:space:]')

{
    printf 'File: %s\n' "$input"
    printf 'Lines: %s\n' "$lines"
    printf 'Words: %s\n' "$words"
    printf 'Bytes: %s\n' "$bytes"
    printf '\n'
    printf 'First 20 non-empty lines:\n'
    # grep exits 1 when nothing matches (e.g. an empty file); that is not an error here.
    { grep -v '^[[:space:]]*$' -- "$input" || true; } | head -n 20 | cat -n
} > "$output"
