#!/usr/bin/env python3
"""Wraps one static binary as a one-layer image in docker-archive format (what `ctr images import`
reads), without a daemon: hack/build-node.sh makes the pause image with it.
usage: mkimage.py BINARY PATH_IN_IMAGE REF OUT.tar"""
import hashlib, io, json, sys, tarfile, time
binary, inpath, ref, out = sys.argv[1:5]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    ti = t.gettarinfo(binary, arcname=inpath.lstrip("/"))
    ti.uid = ti.gid = 0; ti.uname = ti.gname = ""; ti.mode = 0o755; ti.mtime = 0
    with open(binary, "rb") as f:
        t.addfile(ti, f)
layer_bytes = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
config = {
    "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
    "config": {"Entrypoint": [inpath], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mkimage.py " + inpath}],
}
config_bytes = json.dumps(config, separators=(",", ":")).encode()
config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
layer_name = diff_id[7:] + "/layer.tar"
manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
with tarfile.open(out, mode="w") as t:
    for name, data in [(config_name, config_bytes), (layer_name, layer_bytes),
                       ("manifest.json", json.dumps(manifest).encode())]:
        ti = tarfile.TarInfo(name); ti.size = len(data); ti.mtime = 0; ti.mode = 0o644
        t.addfile(ti, io.BytesIO(data))
print(out, diff_id)
