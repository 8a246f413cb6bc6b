"""Policies: this project's MLP and its vision encoder, ONNX files, policies served over a
websocket, and LeRobot's.

Imports :mod:`stages.sim` and below.
"""
