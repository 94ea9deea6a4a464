#!/usr/bin/env python3
"""Writes the yamux_frames seeds: valid frame sequences as a go-plugin host sends them.

Each seed is two control bytes (the application's mode, how the bytes are fed; see
fuzz_targets/yamux_frames.rs) followed by the host's byte stream. Run from anywhere:
    python3 fuzz/seeds/yamux_frames.py
"""
import os
import struct

DATA, WINDOW_UPDATE, PING, GO_AWAY = 0, 1, 2, 3
SYN, ACK, FIN, RST = 1, 2, 4, 8
ECHO, CLOSE_AFTER_FIRST_READ, NEVER_ACCEPT, DROP_ON_ACCEPT, FLUSH, STOP_READING = 1, 2, 4, 8, 16, 32

HERE = os.path.dirname(os.path.abspath(__file__))
GOB = os.path.join(HERE, "..", "..", "..", "metric-provider", "tests", "fixtures", "gob")


def frame(ty, flags, stream, length, payload=b""):
    return struct.pack(">BBHII", 0, ty, flags, stream, length) + payload


def data(stream, payload, flags=0):
    return frame(DATA, flags, stream, len(payload), payload)


def seed(name, mode, feed, wire):
    with open(os.path.join(HERE, "yamux_frames", name), "wb") as f:
        f.write(bytes([mode, feed]) + wire)


with open(os.path.join(GOB, "control.gob"), "rb") as f:
    control = f.read()

# go-plugin's start: control, stdout, stderr, a Control.Ping call on the control stream, a ping.
seed("go_plugin_start", ECHO | FLUSH, 0x0F,
     frame(WINDOW_UPDATE, SYN, 1, 0) + frame(WINDOW_UPDATE, SYN, 3, 0)
     + frame(WINDOW_UPDATE, SYN, 5, 0) + data(1, control) + frame(PING, SYN, 0, 1)
     + frame(WINDOW_UPDATE, FIN, 1, 0) + frame(WINDOW_UPDATE, FIN, 3, 0))

# One stream, a window grant, data split in frames, a half-close, the other half after our FIN.
seed("echo_and_close", ECHO, 0x03,
     frame(WINDOW_UPDATE, SYN, 1, 0) + frame(WINDOW_UPDATE, 0, 1, 65536)
     + data(1, b"hello ") + data(1, b"yamux") + frame(PING, SYN, 0, 42)
     + frame(WINDOW_UPDATE, FIN, 1, 0))

# SYN carried by a data frame, RST, a new stream, a ping answer we never asked for, GoAway.
seed("reset_and_go_away", ECHO | CLOSE_AFTER_FIRST_READ, 0x00,
     data(1, b"syn with data", SYN) + frame(WINDOW_UPDATE, RST, 1, 0)
     + frame(WINDOW_UPDATE, SYN, 3, 0) + data(3, b"second") + frame(PING, ACK, 0, 9)
     + frame(GO_AWAY, 0, 0, 0))

# Streams nobody accepts, data for an unknown stream, a tiny connection buffer.
seed("unaccepted_streams", NEVER_ACCEPT, 0x11,
     b"".join(frame(WINDOW_UPDATE, SYN, i, 0) for i in range(1, 40, 2))
     + data(99, b"nobody") + frame(PING, SYN, 0, 7))

# A reader that stops early, the host filling its window in 4 KiB frames.
seed("window_filled", STOP_READING, 0x0F,
     frame(WINDOW_UPDATE, SYN, 1, 0) + b"".join(data(1, bytes(4096)) for _ in range(12))
     + frame(WINDOW_UPDATE, FIN, 1, 0))

# Streams dropped by the application, then a protocol error (a reused id).
seed("dropped_then_reused", DROP_ON_ACCEPT, 0x05,
     frame(WINDOW_UPDATE, SYN, 1, 0) + frame(WINDOW_UPDATE, RST, 1, 0)
     + frame(WINDOW_UPDATE, SYN, 1, 0))
