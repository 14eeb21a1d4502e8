"""Ops shared by state layers: mixers that keep a fixed-size state per sequence."""
