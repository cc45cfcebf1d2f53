"""The shell scripts the Cube runtime sends into a sandbox (the globs they list by read as ``worker.collect.globs``).

Each is a ``str.format`` template whose values the runtime quotes (``shlex.quote``) before filling them in.
"""

from __future__ import annotations

PREP_SCRIPT = """set -u
ws={ws}; skill={skill}; up={upload}; inputs={inputs}; keep={keep}; stamp={stamp}
mkdir -p -- "$ws/work/inputs" "$ws/out" "$ws/runs" 2>/dev/null || {{
  echo "cannot create the workspace under ${{ws%/*}}: it must exist or be creatable, and be writable by $(id -un 2>/dev/null || id -u)" >&2; exit 3; }}
if [ -n "$inputs" ]; then
  tar -xf "$up" -C "$ws" --no-same-owner --delay-directory-restore --wildcards 'work/*'; rc=$?
  [ -n "$keep" ] || rm -f -- "$up"; [ $rc -eq 0 ] || exit 4
fi
have=; IFS= read -r have 2>/dev/null < "$ws/skills/.$skill.signature"
[ -f "$ws/skills/$skill/SKILL.md" ] && echo "sig=$have" || echo missing
r="$ws/runs/run_$stamp"; i=0
while ! mkdir -m 700 -- "$r" 2>/dev/null; do i=$((i+1)); [ $i -gt 100 ] && exit 5; r="$ws/runs/run_$stamp-$i"; done
echo "run=$r"
{cwd_check}
"""
"""The sandbox user's part of preparing a run: the workspace's folders, the run's inputs, the run folder."""

STAGE_SCRIPT = """set -u
ws={ws}; skill={skill}; up={upload}; signature={signature}; name=${{ws##*/}}
refuse() {{ echo "refusing to stage into $ws: $1" >&2; rm -f -- "$up"; exit 3; }}
as_root=; [ "$(id -u)" = 0 ] && as_root=1
# Everything below works on the folders it has entered (cd -P), never on names a command could swap for links.
rootp=$(cd -P -- "${{ws%/*}}" 2>/dev/null && pwd -P) || refuse "its parent folder is missing"
cd -P -- "$rootp" || refuse "its parent folder is missing"
# The workspaces folder: root's and sticky, so the sandbox user cannot rename or replace a workspace in it.
if [ -n "$as_root" ]; then chown 0:0 . && chmod 1777 . || refuse "cannot take $rootp"; fi
cd -P -- "$name" 2>/dev/null && [ "$(pwd -P)" = "$rootp/$name" ] || refuse "it is not a plain folder"
if [ -n "$as_root" ]; then chown 0:0 . && chmod 755 . || refuse "cannot take it"; fi
[ -L skills ] && rm -f skills
mkdir -p skills && cd -P skills && [ "$(pwd -P)" = "$rootp/$name/skills" ] || refuse "skills/ is not a plain folder"
if [ -n "$as_root" ]; then chown 0:0 . && chmod 755 . || refuse "cannot take skills/"; fi
cd .. || exit 3
[ -f {metadata} ] || printf '%s\\n' {metadata_json} > {metadata}
chmod -R u+w -- "skills/$skill" 2>/dev/null; rm -rf -- "skills/$skill"
tar -xf "$up" -C . --no-same-owner --delay-directory-restore --wildcards 'skills/*'; rc=$?
rm -f -- "$up"; [ $rc -eq 0 ] || exit 4
printf '%s' "$signature" > "skills/.$skill.signature"
"""
"""Staging, as root in the sandbox: the workspaces folder becomes root's and sticky, the workspace folder and
``skills/`` root's, so the command (the sandbox user) can change neither the staged skill nor which folder is
staged, and no link it plants is followed; ``work/``, ``out/`` and ``runs/`` stay the user's."""

FAST_MISS_EXIT_CODE = 97
FAST_GUARD = """s={ws}/skills/.{skill}.signature; IFS= read -r have 2>/dev/null < "$s"
if [ "$have" != {signature} ] || ! mkdir -p -- {ws}/work/inputs {ws}/out 2>/dev/null || ! mkdir -m 700 -- {run} 2>/dev/null; then
  echo {nonce} >&2; exit {code}; fi
"""
"""Before a command in a workspace this process staged: the skill is still there, unchanged, and the run folder
is new; else the command is not run, and the runtime takes the full way (``PREP_SCRIPT``)."""

PACK_SCRIPT = """(set -u
ws={ws}; t={pack_dir}; cap={cap}; budget={budget}; most={most}
mkdir -m 700 -- "$t" && mkdir "$t/heads" && : > "$t/list" && : > "$t/heads.list" && : > "$t/{sizes}" || exit 3
printf %s {patterns} | base64 -d > "$t/patterns" || exit 3
cd -- "$ws" || exit 3; n=0
add() {{  # a regular file: whole, or its head with its true size alongside
  local path=$1 size=$2 take=$2
  [ $cap -ge 0 ] && [ $take -gt $cap ] && take=$cap; [ $take -gt $budget ] && take=$budget
  budget=$((budget-take))
  if [ $take -lt $size ]; then
    mkdir -p -- "$t/heads/$(dirname -- "$path")"; head -c $take -- "$path" > "$t/heads/$path"
    printf '%s\\0' "$path" >> "$t/heads.list"; printf '%s\\0%s\\0' "$path" "$size" >> "$t/{sizes}"
  else
    printf '%s\\0' "$path" >> "$t/list"
  fi
}}
while IFS= read -r -d '' base && IFS= read -r -d '' depth && IFS= read -r -d '' re; do
  real=$(realpath -e -- "$base" 2>/dev/null) || continue
  case "$real" in "$ws") rel=.;; "$ws"/*) rel="./${{real#"$ws"/}}";; *) continue;; esac
  span=(); [ "$depth" -gt 0 ] && span=(-mindepth "$depth" -maxdepth "$depth")
  while IFS= read -r -d '' line; do
    kind=${{line%% *}}; line=${{line#* }}; size=${{line%% *}}; sub=${{line#* }}
    [[ $sub =~ $re ]] || continue
    n=$((n+1)); [ $n -gt $most ] && break 2
    path="$rel/$sub"; path=${{path#./}}
    if [ "$kind" = f ]; then add "$path" "$size"; continue; fi
    printf '%s\\0' "$path" >> "$t/list"
    if [ "$kind" = l ] && target=$(realpath -e -- "$path" 2>/dev/null) && [ -f "$target" ]; then
      case "$target" in "$ws"/*) add "${{target#"$ws"/}}" "$(stat -c %s -- "$target")";; esac
    fi
  done < <(find "$rel" "${{span[@]}}" \\( -type f -o -type l -o -type p -o -type c -o -type b -o -type s \\) \\
             -printf '%y %s %P\\0' 2>/dev/null)
done < "$t/patterns"
tar -cf "$t/out.tar" --null --no-recursion --hard-dereference -C "$ws" -T "$t/list" -C "$t/heads" -T "$t/heads.list" \\
  -C "$t" {sizes} || exit 4)
"""
"""Pack what output patterns may match into ``<pack_dir>/out.tar``: whole files up to the per-file cap and the
byte budget, heads of longer ones (their true sizes in the sizes member), links, FIFOs and devices as they are."""


PROBE_SCRIPT = """python=$(PATH={path}; command -v python3) || {{ echo "no python3 on the runs' PATH ({path})" >&2; exit 3; }}
printf '%s\\n' "$python"; id -u; "$python" -I -c {probe}
"""
"""What a sandbox's ``python3`` is, asked as the sandbox user (as runs will find it): its path, the user's id,
and the answer to ``worker.environments.target.PROBE``."""

SWITCH_USER = """import os, sys
uid = int(sys.argv[1]); os.setgroups([]); os.setgid(uid); os.setuid(uid)
if sys.argv[2:] == ["--kill-all"]:
    try: os.kill(-1, 9)
    except ProcessLookupError: pass
else: os.execv(sys.argv[2], sys.argv[2:])
"""
"""Run by the sandbox's ``python3`` as root: become ``argv[1]`` and run ``argv[2:]``, or kill every process of
that user (``--kill-all``). Templates need nothing but python3 for it."""

ENVS_FOLDER = """root={root}; e={folder}
refuse() {{ echo "cannot keep environments in $root/$e: $1" >&2; exit 3; }}
as_root=; [ "$(id -u)" = 0 ] && as_root=1
mkdir -p -- "$root" 2>/dev/null; rootp=$(cd -P -- "$root" 2>/dev/null && pwd -P) && cd -P -- "$rootp" || refuse "$root is missing"
if [ -n "$as_root" ]; then
  chown 0:0 . && chmod 1777 . || refuse "cannot take $rootp"
  if [ -L "$e" ] || {{ [ -e "$e" ] && [ "$(stat -c %u -- "$e")" != 0 ]; }}; then rm -rf -- "$e"; fi
fi
mkdir -m 755 -- "$e" 2>/dev/null; cd -P -- "$e" && [ "$(pwd -P)" = "$rootp/$e" ] || refuse "it is not a plain folder"
[ -z "$as_root" ] || [ "$(stat -c %u .)" = 0 ] || refuse "it is not root's"
envs=$PWD
"""
"""As root, before anything is done with environments: enter their folder, ``<root>/.skillrun-envs``, made if
missing. It and the workspaces folder are root's (the latter sticky, as staging makes it), so the sandbox user can
neither change an environment nor swap the folder; anything else found at its name is removed first."""

ENV_STATUS_SCRIPT = ENVS_FOLDER + """[ -n {key} ] && [ -d {key} ] && echo env=1
[ -x {uv} ] && echo uv=1
exit 0
"""
"""Whether the environment ``key`` and the ``uv`` binary are in the sandbox already."""

ENV_BUILD = """key={key}; python={python}; b=$envs/.build-$key
exec 9>>.lock; command -v flock >/dev/null && flock 9
if [ -d "$key" ]; then rm -f -- {uploads}; echo placed=1; exit 0; fi
switch=(); [ -n "$as_root" ] && switch=("$python" -I -c {switch} {uid})
fail() {{ echo "failed=$1"; echo "rc=$2"; cd -- "$envs"; [ -n "$as_root" ] && "${{switch[@]}}" --kill-all; rm -rf -- "$b"; exit 4; }}
rm -rf -- .build-*; mkdir -m 700 -- "$b" || refuse "cannot make $b"
"""
"""The start of a build, as root in the environments folder: one build at a time in a sandbox (``flock``, where
the template has it), nothing to do when the environment is there, and a build folder of its own. A build's steps
run as a user id of their own (``switch``, on a sandbox with root), whose every process is killed afterwards."""

ENV_SEAL = """[ -z "$as_root" ] || "${{switch[@]}}" --kill-all
[ -z "$as_root" ] || chown -R -h 0:0 "$b/env" || fail "sealing the environment" $?
chmod -R u=rwX,go=rX "$b/env" && mv -T -- "$b/env" "$envs/$key" || fail "placing the environment" $?
rm -rf -- "$b"; echo placed=1
"""
"""The end of a build: the environment becomes root's, read-only to everyone else, and is renamed into place."""

ENV_INSTALL_SCRIPT = ENVS_FOLDER + """uv={uv}; new_uv={new_uv}; lock={lock}; ca={ca}; cap={cap}
if [ -n "$new_uv" ]; then chmod 755 -- "$new_uv" && mv -f -- "$new_uv" "$uv" || refuse "cannot place uv"; fi
""" + ENV_BUILD + """deadline=(timeout -s KILL {limit}); command -v timeout >/dev/null || deadline=()
mkdir -- "$b/home" "$b/tmp" "$b/cache" && mv -- "$lock" "$b/lock.txt" || refuse "cannot fill $b"
settings=(); if [ -n "$ca" ]; then mv -- "$ca" "$b/ca.pem" && settings=(SSL_CERT_FILE="$b/ca.pem"); fi
[ -z "$as_root" ] || chown -R {uid}:{uid} "$b" || refuse "cannot give $b to the build"
cd -- "$b" || refuse "cannot enter $b"
step() {{ "${{deadline[@]}}" "${{switch[@]}}" /usr/bin/env -i PATH={path} HOME="$b/home" TMPDIR="$b/tmp" LANG=C.UTF-8 \\
  UV_CACHE_DIR="$b/cache" UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1 UV_LINK_MODE=copy {index} \\
  "${{settings[@]}}" "$uv" "$@"; }}
step venv --relocatable --quiet --python "$python" env || fail "making the environment" $?
step pip sync --python env/bin/python --require-hashes --compile-bytecode --quiet lock.txt || fail "installing the dependencies" $?
size=$(du -sb env | cut -f1); echo "size=$size"; [ "$size" -le "$cap" ] || fail "too big" 0
""" + ENV_SEAL
"""Install a lock uploaded to ``lock`` into the environment ``key`` with the sandbox's own uv (``uv``, moved into
place from ``new_uv`` when it was just uploaded) and the package index: as a build user of its own, with an
environment from scratch, a cache of its own and each step stopped at ``limit`` seconds; at most ``cap`` bytes."""

ENV_PLACE_SCRIPT = ENVS_FOLDER + """archive={archive}; version={version}; xy=${{version%.*}}
""" + ENV_BUILD + """tar -xf "$archive" -C "$b" --no-same-owner; rc=$?; rm -f -- "$archive"; [ $rc -eq 0 ] || fail "unpacking the environment" $rc
cd -- "$b/env" || fail "unpacking the environment" 1
for d in lib/python3*; do [ "$d" = "lib/python$xy" ] || mv -T -- "$d" "lib/python$xy" || fail "renaming $d" $?; done
for f in bin/python bin/python3 bin/python3.*; do [ -L "$f" ] && rm -f -- "$f"; done
ln -s "$python" bin/python && ln -s python bin/python3 && ln -s python "bin/python$xy" || fail "linking $python" $?
printf 'home = %s\\ninclude-system-site-packages = false\\nversion = %s\\nrelocatable = true\\n' "${{python%/*}}" "$version" > pyvenv.cfg
"$python" -I -m compileall -q "lib/python$xy/site-packages" >/dev/null 2>&1
""" + ENV_SEAL
"""Take an environment built on the worker (uploaded as a tar archive of ``env/``) for this sandbox's python:
its interpreter links, its ``lib/python3.X`` folder and ``pyvenv.cfg`` made the sandbox's, its bytecode compiled
by that interpreter; then sealed and placed as ``key``."""


__all__ = [
    "ENV_INSTALL_SCRIPT",
    "ENV_PLACE_SCRIPT",
    "ENV_STATUS_SCRIPT",
    "FAST_GUARD",
    "FAST_MISS_EXIT_CODE",
    "PACK_SCRIPT",
    "PREP_SCRIPT",
    "PROBE_SCRIPT",
    "STAGE_SCRIPT",
    "SWITCH_USER",
]
