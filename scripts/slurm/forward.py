#!/usr/bin/env python3
"""TCP forwarder between network namespaces, for the multi-node test cluster (cluster.sh).

    forward.py LISTEN_PORT TARGET_HOST TARGET_PORT [NETNS_FILE]

Listens on 127.0.0.1:LISTEN_PORT in the namespace it was started in, then, when
NETNS_FILE is given (e.g. /proc/PID/ns/net), moves into that network namespace, so that
every connection it accepts is relayed to TARGET_HOST:TARGET_PORT as seen from there.
A socket keeps the namespace it was created in, so the listener stays where it was.

Why: every client of the test cluster reads one slurm.conf, whose SlurmctldHost is
127.0.0.1. slurmctld runs in the cluster's switch namespace; the host's clients (sbatch,
squeue, scontrol from the shell) reach it through a forwarder in the host namespace, and
each node's slurmd and srun through a forwarder on that node's loopback, which crosses
the node's own link (so a cut node loses slurmctld as well).
"""
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay(client, target):
    try:
        upstream = socket.create_connection(target, timeout=10)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    t = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    t.start()
    pump(client, upstream)
    t.join()
    client.close()
    upstream.close()


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: forward.py LISTEN_PORT TARGET_HOST TARGET_PORT [NETNS_FILE]")
    listen_port, target = int(sys.argv[1]), (sys.argv[2], int(sys.argv[3]))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(128)
    if len(sys.argv) == 5:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(sys.argv[4], os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            sys.exit(f"forward.py: setns {sys.argv[4]}: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    while True:
        client, _ = server.accept()
        threading.Thread(target=relay, args=(client, target), daemon=True).start()


if __name__ == "__main__":
    main()
