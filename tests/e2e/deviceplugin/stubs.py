"""The Python gRPC stubs of the kubelet's device plugin API (api.proto beside this file), compiled with
grpcio-tools' protoc the first time a process asks for them. Nothing generated is committed, so nothing can
go stale: the modules always come from the .proto in the repository.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from grpc_tools import protoc

PROTO = Path(__file__).with_name("api.proto")
# The generated modules' package (a name of our own: api_pb2_grpc imports api_pb2 through it).
PACKAGE = "k8s_deviceplugin_v1beta1"
PROTO_SHA256 = "b780bfeac99c93c231dc165ce417f4da88481eececa0c65eeb90f5f2e9b5b65b"


class StubError(RuntimeError):
    pass


@functools.cache
def load() -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc): messages, and the Registration / DevicePlugin services (package v1beta1)."""
    digest = hashlib.sha256(PROTO.read_bytes()).hexdigest()
    if digest != PROTO_SHA256:
        raise StubError(f"{PROTO} differs from the upstream file recorded in README.md (sha256 {digest})")
    out = Path(tempfile.mkdtemp(prefix="gpu-stack-deviceplugin-"))
    (out / PACKAGE).mkdir()
    (out / PACKAGE / "__init__.py").write_text("", encoding="utf-8")
    shutil.copy(PROTO, out / PACKAGE / "api.proto")
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
                        str(out / PACKAGE / "api.proto")])
    if code != 0:
        raise StubError(f"protoc failed on {PROTO} (exit {code})")
    # The generated package is imported from where protoc wrote it: registered under its own name (api_pb2_grpc
    # imports api_pb2 through it), with that directory as its only search location, so the import path
    # stays as it is.
    init = out / PACKAGE / "__init__.py"
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.api_pb2"), importlib.import_module(f"{PACKAGE}.api_pb2_grpc")
