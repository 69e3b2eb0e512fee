"""Test and demo support only, never the product: the local Kubernetes bed (real
kube-apiserver, kube-controller-manager, etcd, kwok), the engine emulator, the stand-in
operator, the load generator and the demo (``python -m testbed demo``)."""
