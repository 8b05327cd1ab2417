#!/usr/bin/env bash
# Unpacks tools/device/bundle.sh's libraries on the GPU machine and prints the
# library path the bundled programs need (docs/cuda.md, "Benchmarking on a GPU machine").
#
#   eval "$(tools/device/unbundle.sh <out-dir>)"   # sets LD_LIBRARY_PATH and QKV_BUNDLE_BIN
#
# <out-dir>/libs.tar.xz goes to $QKV_LIBS_DIR (default /tmp/qkvlibs), replacing what was
# there. The libraries the manifest says the machine supplies (libcublas.so.13, ...) are
# looked for where ld.so already finds them (ldconfig -p), else in /usr/local/cuda's
# library folders and in python3's site-packages nvidia/*/lib (PyTorch's CUDA wheels);
# each folder that holds one joins the path after the bundle's own. stdout is two lines,
# `export LD_LIBRARY_PATH=...`, after `export QKV_BUNDLE_BIN=...` (the folder of the bundled
# programs: <out-dir>/bin, or $QKV_LIBS_DIR/bin where bundle.sh packed them into
# programs.tar.xz); the rest goes to stderr, including `ldd` of every bundled program with
# that path (the libraries it finds outside the bundle, and any still "not found").
# Exit status: 0; 2 when the bundle is missing or cannot be unpacked; 3 when some
# library is still not found (the export lines are printed all the same).
set -uo pipefail

[[ $# -eq 1 ]] || {
  echo "usage: $0 <out-dir>" >&2
  exit 2
}
bundle=$1
dest=${QKV_LIBS_DIR:-/tmp/qkvlibs}
if [[ ! -f $bundle/libs.tar.xz || ! -f $bundle/manifest.txt ]]; then
  echo "unbundle.sh: no $bundle/libs.tar.xz or manifest.txt: run tools/device/bundle.sh where qkv was built, and carry $bundle" >&2
  exit 2
fi
rm -rf "$dest"
mkdir -p "$dest"
# python3's lzma where the machine has no xz program
if ! { command -v xz >/dev/null && tar -C "$dest" -xJf "$bundle/libs.tar.xz"; } &&
  ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle/libs.tar.xz" "$dest"; then
  echo "unbundle.sh: could not unpack $bundle/libs.tar.xz into $dest" >&2
  exit 2
fi
echo "unbundle.sh: $(find "$dest/lib" -type f | wc -l) libraries in $dest/lib" >&2
bin=$(cd "$bundle" && pwd)/bin
if [[ -f $bundle/programs.tar.xz ]]; then
  bin=$dest/bin
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle/programs.tar.xz" "$dest" || {
    echo "unbundle.sh: could not unpack $bundle/programs.tar.xz into $dest" >&2
    exit 2
  }
fi

# Folders that may hold the CUDA toolkit's libraries on the GPU machine.
candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
while IFS= read -r dir; do
  candidates+=("$dir")
done < <(python3 - 2>/dev/null <<'EOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")) + glob.glob(os.path.join(root, "nvidia", "lib"))):
        print(d)
EOF
)

path=$dest/lib
read -r -a needed <<<"$(sed -n 's/^machine: //p' "$bundle/manifest.txt")"
for name in "${needed[@]}"; do
  if ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$name "; then
    continue
  fi
  found=
  for dir in "${candidates[@]}"; do
    if [[ -e $dir/$name ]]; then
      found=$dir
      break
    fi
  done
  if [[ -n $found ]]; then
    echo "unbundle.sh: $name in $found" >&2
    [[ :$path: == *":$found:"* ]] || path=$path:$found
  elif [[ $name == libcu* || $name == libnv* ]]; then
    echo "unbundle.sh: $name is nowhere here (looked in ldconfig -p and ${candidates[*]})" >&2
  fi
done

full=$path # then the caller's path (the driver's folder may be on it), less what is already there
IFS=: read -r -a inherited <<<"${LD_LIBRARY_PATH:-}"
for dir in "${inherited[@]}"; do
  [[ -z $dir || :$full: == *":$dir:"* ]] || full=$full:$dir
done
status=0
for program in "$bin"/*; do
  report=$(LD_LIBRARY_PATH=$full ldd "$program" 2>&1)
  # the bundle's own libraries counted, the rest (the machine's, or not found) shown
  echo "unbundle.sh: ldd $program: $(grep -c "=> $dest/lib/" <<<"$report") from $dest/lib; the others:" >&2
  grep -v -e "=> $dest/lib/" -e 'linux-vdso' <<<"$report" >&2
  if grep -q 'not found' <<<"$report"; then
    echo "unbundle.sh: $program: $(grep -c 'not found' <<<"$report") libraries not found" >&2
    status=3
  fi
done
printf 'export QKV_BUNDLE_BIN=%q\n' "$bin"
printf 'export LD_LIBRARY_PATH=%q\n' "$full"
exit "$status"
