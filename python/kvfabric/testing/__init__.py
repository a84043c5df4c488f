# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Test and example helpers: a loopback cluster, a tiny GPT."""
