"""Beam plumbing the commands share: runners, options, filesystems, output safety, progress."""
