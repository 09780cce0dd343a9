"""A stand-in for the NVIDIA device plugin that speaks the kubelet's device plugin API
(k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, api.proto here) for nodes without GPUs: model.py says what
NVIDIA/k8s-device-plugin v0.20.0 would advertise and answer for a node of the chart's render, server.py
serves it over gRPC and registers with the kubelet, `python -m tests.e2e.deviceplugin` runs it as a
process (on an e2e node).
"""
