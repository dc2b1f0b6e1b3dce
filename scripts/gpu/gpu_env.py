#!/usr/bin/env python3
"""What scripts/gpu_check.sh needs to know about a machine's Python side: PyTorch and the
CUDA libraries of its pip wheels (site-packages/nvidia/*/lib), and which of those files a
program loaded.

    gpu_env.py probe [--json OUT]          torch, its cuDNN/NCCL/CUDA versions, the GPU,
                                           every nvidia-* wheel with its version and the
                                           library folders it installed
    gpu_env.py libdirs                     those folders, one a line, for LD_LIBRARY_PATH
    gpu_env.py resolve LIST [--probe P]    LIST: `ldd` output or one path a line (e.g.
                                           /proc/PID/maps libraries); prints one line per
                                           CUDA library: soname, path, the file's version
                                           and the wheel (or folder) it came from

Without torch or without wheels the probe still answers (torch: null, wheels: []), so
the dry run on a machine without a GPU exercises the same code.
"""
import argparse
import glob
import json
import os
import re
import site
import sys

# The CUDA libraries the backend and its tests load (directly or through cuDNN).
CUDA_LIB = re.compile(r"^lib(cudart|cublasLt|cublas|cudnn[a-z_]*|nccl|nvrtc[a-z-]*|nvJitLink|"
                      r"cuda)\.so")


def site_dirs():
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen, out = set(), []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def wheel_lib_dirs(sites):
    """Folders under site-packages/nvidia/ that hold shared libraries, sorted."""
    found = set()
    for s in sites:
        for pattern in ("nvidia/*/lib", "nvidia/*/lib64", "nvidia/*/*/lib"):
            for d in glob.glob(os.path.join(s, pattern)):
                if glob.glob(os.path.join(d, "*.so*")):
                    found.add(os.path.realpath(d))
    return sorted(found)


def wheels():
    """[{name, version, dirs}] of the installed distributions named nvidia-*."""
    try:
        from importlib import metadata
    except ImportError:
        return []
    out = []
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        if not name.lower().startswith("nvidia-"):
            continue
        dirs = set()
        for f in dist.files or []:
            if ".so" in f.name:
                try:
                    dirs.add(os.path.realpath(os.path.dirname(str(f.locate()))))
                except Exception:
                    pass
        out.append({"name": name, "version": dist.version, "dirs": sorted(dirs)})
    return sorted(out, key=lambda w: w["name"])


def torch_facts():
    try:
        import torch
    except Exception as e:  # no torch here: the dry run on a CPU machine without one
        return {"error": f"torch not importable: {e}"}
    facts = {"version": torch.__version__, "cuda": torch.version.cuda,
             "file": os.path.dirname(torch.__file__)}
    try:
        facts["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() \
            else None
    except Exception as e:
        facts["cudnn"] = f"error: {e}"
    try:
        v = torch.cuda.nccl.version()
        facts["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:
        facts["nccl"] = None
        facts["nccl_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    facts["cuda_available"] = bool(torch.cuda.is_available())
    if facts["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        facts["device"] = {"name": p.name, "sm": f"{p.major}{p.minor}",
                           "sms": p.multi_processor_count,
                           "memory_gib": round(p.total_memory / 2**30, 1)}
    return facts


def probe():
    sites = site_dirs()
    return {"python": sys.version.split()[0], "executable": sys.executable, "site": sites,
            "torch": torch_facts(), "wheels": wheels(), "libdirs": wheel_lib_dirs(sites)}


def file_version(path):
    """The version a library file's name carries beyond its soname: libcudnn.so.9 ->
    libcudnn.so.9.13.0 gives 9.13.0; "" when the file is named by its soname alone."""
    real = os.path.basename(os.path.realpath(path))
    if real == os.path.basename(path):
        return ""
    m = re.search(r"\.so\.([0-9][0-9.]*)$", real)
    return m.group(1) if m else ""


def parse_list(text):
    """(soname, path) pairs from `ldd` output or a list of paths."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => not found", line)
        if m:
            out.append((m.group(1), "not found"))
            continue
        m = re.match(r"^(\S+) => (\S+)", line)
        if m:
            out.append((m.group(1), m.group(2)))
            continue
        m = re.match(r"^(\S+\.so\S*) (/\S+)$", line)  # "soname path" (gpu_check.sh's ldd_pairs)
        if m:
            out.append((m.group(1), m.group(2)))
            continue
        if line.startswith("/"):
            path = line.split()[0]
            out.append((os.path.basename(path), path))
    return out


def resolve(text, probe_facts):
    owners = {}
    for w in probe_facts.get("wheels", []):
        for d in w["dirs"]:
            owners[d] = f"wheel {w['name']} {w['version']}"
    lines, seen = [], set()
    for soname, path in parse_list(text):
        if not CUDA_LIB.match(soname) or (soname, path) in seen:
            continue
        seen.add((soname, path))
        if path == "not found":
            lines.append(f"{soname}: NOT FOUND")
            continue
        folder = os.path.realpath(os.path.dirname(path))
        owner = owners.get(folder, folder)
        version = file_version(path)
        lines.append(f"{soname}: {path}" + (f" (file {version})" if version else "") +
                     f", from {owner}")
    return lines


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--json", default="")
    sub.add_parser("libdirs")
    r = sub.add_parser("resolve")
    r.add_argument("list")
    r.add_argument("--probe", default="")
    a = ap.parse_args(argv)
    if a.command == "probe":
        facts = probe()
        text = json.dumps(facts, indent=1)
        if a.json:
            with open(a.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        print(text)
        return 0
    if a.command == "libdirs":
        for d in wheel_lib_dirs(site_dirs()):
            print(d)
        return 0
    try:
        with open(a.list, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"error: {a.list}: cannot read: {e.strerror}", file=sys.stderr)
        return 2
    facts = {}
    if a.probe:
        try:
            with open(a.probe, encoding="utf-8") as f:
                facts = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: {a.probe}: {e}", file=sys.stderr)
            return 2
    for line in resolve(text, facts):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
