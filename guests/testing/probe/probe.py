"""Test guest: runs Python snippets against whatever WASI the host provides.

componentize-py bundles only the modules imported while the component is built, so every module
a test snippet may use is imported here.
"""

import base64
import errno
import hashlib
import io
import json
import os
import random
import shutil
import stat
import sys
import time
import traceback
import uuid

import wit_world
from componentize_py_types import Err

_MODULES = {
    "base64": base64,
    "errno": errno,
    "hashlib": hashlib,
    "io": io,
    "json": json,
    "os": os,
    "random": random,
    "shutil": shutil,
    "stat": stat,
    "sys": sys,
    "time": time,
    "uuid": uuid,
}


class WitWorld(wit_world.WitWorld):
    def run(self, code: str) -> str:
        scope = dict(_MODULES)
        try:
            exec(code, scope)
        except BaseException:
            raise Err(traceback.format_exc()) from None
        return str(scope.get("result"))

    def spam(self, text: str, times: int) -> None:
        for _ in range(times):
            print(text)

    def churn(self, times: int) -> int:
        for _ in range(times):
            time.monotonic_ns()
            time.time_ns()
            os.urandom(16)
        return times * 3
