"""Kubernetes contexts (`k8s/<context>`) through the official `kubernetes` client."""
