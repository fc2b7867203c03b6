"""Full-kernel guests: the ``vm`` backend (one job in a QEMU guest, :mod:`.guest`) and the lab VM
(Vagrant with vagrant-libvirt, :mod:`.labvm`)."""
