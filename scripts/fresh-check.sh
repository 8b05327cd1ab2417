#!/usr/bin/env bash
# make fresh-check: `make demo` and `make test` of the committed HEAD on a fresh
# Debian 12 root, as a newcomer's machine runs them (docs/testing.md).
#
# The root is `debootstrap --variant=minbase` bookworm plus only what a new machine
# of this kind has before the project runs: make, python3, python3-venv, git,
# ca-certificates. It is cached as a tarball outside the repository and every run
# unpacks a new copy, so nothing of a previous run leaks in. The host lends the root
# what makes the network work as it does for the host (apt sources, DNS, the CA
# bundle, pip's configuration and the PIP_*/SSL_CERT_* variables) and download and
# compiler caches (apt .debs, pip, ccache) that change how fast, not what, it builds.
#
# Needs root (debootstrap, chroot, mounts) and Debian's archive. Settings:
#   QKV_FRESH_CACHE    base tarball and apt .deb cache (default /var/cache/qkv-fresh)
#   QKV_FRESH_WORK     where the run's root is unpacked (default /var/tmp)
#   QKV_FRESH_CCACHE   0: no host ccache (a cold build); default: share the host's
#   QKV_FRESH_KEEP     1: keep the unpacked root after the run (mounts still undone)
#   QKV_FRESH_TARGETS  make targets run in the root (default "demo test")
#   QKV_FRESH_CUDA     1: lend the host's CUDA toolkit (/usr/local/cuda, read-only, its
#                      bin/ on PATH), so that QKV_CUDA=auto builds the CUDA backend in
#                      the root, as on a machine with the toolkit installed; 0: do not
#                      (the build of a machine without nvcc); default: 1 when the host
#                      has /usr/local/cuda/bin/nvcc
set -euo pipefail

# Mounts live in a private mount namespace: whatever happens to this script, they
# vanish with it and never show on the host (the EXIT trap still undoes them first).
if [ -z "${QKV_FRESH_NS:-}" ] && command -v unshare >/dev/null && unshare --mount true 2>/dev/null; then
  exec env QKV_FRESH_NS=1 unshare --mount --propagation private "$0" "$@"
fi

# The checkout may belong to another user than root (CI's clone): git must still read it.
git() { command git -c safe.directory='*' "$@"; }

suite=bookworm
base_packages=make,python3,python3-venv,git,ca-certificates
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cache=${QKV_FRESH_CACHE:-/var/cache/qkv-fresh}
targets=${QKV_FRESH_TARGETS:-demo test}
start=$(date +%s)
phase_start=$start

say() { echo "fresh-check: $*"; }
die() { say "error: $*" >&2; exit 1; }
# Ends a phase: its own time and the total so far.
phase() {
  local now; now=$(date +%s)
  say "$1 took $((now - phase_start)) s (total $((now - start)) s)"
  phase_start=$now
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts); run it with sudo"

# ---- cleanup: undo every mount under the work dir, then remove it ------------------
work=""
mounts_under() { awk -v p="$1/" 'index($2 "/", p) == 1 { print $2 }' /proc/self/mounts | sort -r; }
cleanup() {
  local rc=$? m
  trap '' INT TERM  # a second signal (make passes its own on) must not cut the cleanup short
  [ $rc -eq 0 ] || say "failed (exit $rc) after $(( $(date +%s) - start )) s" >&2
  [ -n "$work" ] && [ -d "$work" ] || exit $rc
  for m in $(mounts_under "$work"); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
  if [ -n "$(mounts_under "$work")" ]; then
    say "still mounted under $work, not removing it:" >&2; mounts_under "$work" >&2
  elif [ "${QKV_FRESH_KEEP:-0}" = 1 ]; then
    say "kept the root: $work/root"
  else
    rm -rf "$work"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

apt_install_host() {  # host tools this script itself needs
  local missing=() p
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing on the host: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
apt_install_host debootstrap zstd

# The host's Debian mirror (deb822 or one-line sources), else deb.debian.org.
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
         grep -E '^(URIs:|deb )' | grep -oE 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)
mirror=${mirror:-http://deb.debian.org/debian}

# ---- the base root, cached -------------------------------------------------------------
# Its name carries what went into it, so a changed package list makes a new one.
key=$(echo "$suite $base_packages $mirror" | sha256sum | cut -c1-12)
base=$cache/$suite-minbase-$key.tar.zst
mkdir -p "$cache/apt-archives/partial"
work=$(mktemp -d "${QKV_FRESH_WORK:-/var/tmp}/qkv-fresh.XXXXXX")
root=$work/root
mkdir "$root"
if [ -f "$base" ]; then
  say "base root: $base (cached)"
else
  say "base root: debootstrap --variant=minbase $suite from $mirror (+ $base_packages)"
  debootstrap --variant=minbase --include="$base_packages" --cache-dir="$cache/apt-archives" \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  for m in $(mounts_under "$root"); do umount "$m"; done  # debootstrap may leave /proc mounted
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" --numeric-owner -I 'zstd -q -T0 -3' -cpf "$base.tmp" . && mv "$base.tmp" "$base"
  rm -rf "$root" && mkdir "$root"
  phase "debootstrap (cold base)"
fi
tar -C "$root" --numeric-owner -I zstd -xpf "$base"
phase "unpacking the base root"

# ---- what the host lends the root -----------------------------------------------------------
copy_in() {  # copy host files into the root at the same path (dereferencing links)
  local f
  for f in "$@"; do
    [ -e "$f" ] || continue
    mkdir -p "$root$(dirname "$f")"
    rm -rf "${root:?}$f"
    cp -rL "$f" "$root$f"
  done
}
# apt: the host's Debian sources (the same mirror and suites), DNS and hosts.
debian_sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] && grep -qE "^[^#]*($mirror|debian-security)" "$f" && debian_sources+=("$f")
done
if [ ${#debian_sources[@]} -gt 0 ]; then
  : >"$root/etc/apt/sources.list"
  copy_in "${debian_sources[@]}"
fi
copy_in /etc/resolv.conf /etc/hosts
# TLS and pip: the CA bundle and every file pip's configuration and the environment name.
pip_files=$(python3 -m pip config debug 2>/dev/null | sed -n 's/^ *\(\/[^,]*\), exists: True$/\1/p' || true)
env_names=$(compgen -e | grep -E '^(PIP_|SSL_CERT_|REQUESTS_CA_BUNDLE$|CURL_CA_BUNDLE$|(https?|no|all)_proxy$|(HTTPS?|NO|ALL)_PROXY$)' || true)
pass_env=()
for name in $env_names; do
  pass_env+=("$name=${!name}")
  case "$name" in PIP_FIND_LINKS | PIP_INDEX_URL | PIP_EXTRA_INDEX_URL | *_proxy | *_PROXY) continue ;; esac
  [[ "${!name}" == /* ]] && copy_in "${!name}"   # PIP_CERT, SSL_CERT_FILE/DIR, ...
done
copy_in /etc/ssl/certs/ca-certificates.crt /usr/local/share/ca-certificates $pip_files

mnt() {  # mnt SRC DEST-IN-ROOT [mount options...]: bind mount, creating the target
  local src=$1 dest=$root$2; shift 2
  mkdir -p "$dest"
  mount --bind "$@" "$src" "$dest"
}
mount -t proc proc "$root/proc"
mnt /dev /dev
mnt /dev/pts /dev/pts
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"   # OpenMP and Python multiprocessing
mnt /sys /sys -o ro
# Local wheel directories pip is pointed at (PIP_FIND_LINKS), read-only.
for d in ${PIP_FIND_LINKS:-}; do [ -d "$d" ] && mnt "$d" "$d" -o ro; done
# Caches: apt's .debs (kept across runs in $cache), pip's, and ccache's.
mnt "$cache/apt-archives" /var/cache/apt/archives
pip_cache=$(python3 -m pip cache dir 2>/dev/null || true)
[ -n "$pip_cache" ] && [ -d "$pip_cache" ] && mnt "$pip_cache" /root/.cache/pip
ccache_env=()
if [ "${QKV_FRESH_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  ccache_dir=$(ccache -k cache_dir 2>/dev/null || true)
  if [ -n "$ccache_dir" ]; then
    mkdir -p "$ccache_dir"
    mnt "$ccache_dir" /root/.cache/ccache
    # The clone is at the checkout's own path (below), so the compile commands are
    # the host's, absolute paths included (tests get -DQKV_SOURCE_DIR=...): what the
    # host built before is a cache hit.
    ccache_env=(CCACHE_DIR=/root/.cache/ccache "CCACHE_BASEDIR=$(ccache -k base_dir)" "CCACHE_MAXSIZE=$(ccache -k max_size)")
  fi
fi

# The CUDA toolkit (docs/cuda.md): the host's, read-only, at the same path.
cuda_path=""
if [ "${QKV_FRESH_CUDA:-auto}" != 0 ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_real=$(readlink -f /usr/local/cuda)
  mnt "$cuda_real" "$cuda_real" -o ro
  [ "$cuda_real" = /usr/local/cuda ] || ln -sfn "$cuda_real" "$root/usr/local/cuda"
  cuda_path=:/usr/local/cuda/bin
  say "lending the host's CUDA toolkit ($cuda_real): the root builds the CUDA backend"
elif [ "${QKV_FRESH_CUDA:-auto}" = 1 ]; then
  die "QKV_FRESH_CUDA=1 but the host has no /usr/local/cuda/bin/nvcc"
fi

# ---- the checkout ---------------------------------------------------------------------------
commit=$(git -C "$repo" rev-parse HEAD)
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] ||
  say "warning: uncommitted changes in $repo are NOT tested, only commit ${commit:0:12}"
src=$repo  # the clone's path inside the root
git clone --quiet --no-checkout "$repo" "$root$src"
git -C "$root$src" checkout --quiet --detach "$commit"
say "testing commit $(git -C "$repo" log -1 --format='%h %s' "$commit")"
phase "setting up the root"

# ---- the two commands -------------------------------------------------------------------------
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin$cuda_path \
    ${CI:+CI=$CI} ${QKV_WERROR:+QKV_WERROR=$QKV_WERROR} "${pass_env[@]}" "${ccache_env[@]}" \
    bash -c "cd '$src' && $*"
}
# Each output line gets the seconds since the run began, so the log shows how long
# apt, pip, the build and each test step took.
stamp() { while IFS= read -r line; do printf '[%5ds] %s\n' $(( EPOCHSECONDS - start )) "$line"; done; }
for t in $targets; do
  say "make $t (in the fresh root)"
  in_root make "$t" 2>&1 | stamp || die "make $t failed in the fresh root (commit ${commit:0:12})"
  phase "make $t"
done
say "passed: make ${targets// /, make } on a fresh Debian 12 root, commit ${commit:0:12}, $(( $(date +%s) - start )) s"
