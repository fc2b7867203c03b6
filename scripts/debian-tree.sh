# Sourced by build-vm-image.sh and build-box.sh: a Debian 12 tree from Debian packages only.
#
#   debian_tree OUT_DIR PACKAGES    sets WORK (a temporary folder in OUT_DIR, removed on exit)
#                                   and TREE (WORK/tree: debootstrap's minbase plus PACKAGES)
# The mirror is FABRICLAB_DEBIAN_MIRROR, else the one this machine's apt uses, else Debian's.
MIRROR=${FABRICLAB_DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

debian_tree() {
  local out=$1 packages=$2
  mkdir -p "$out"
  WORK=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  TREE=$WORK/tree
  log "debootstrap bookworm from $MIRROR"
  debootstrap --variant=minbase --include="$packages" bookworm "$TREE" "$MIRROR" \
    > "$WORK/debootstrap.log" 2>&1 || { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
}
