"""setup.py - the one step pyproject.toml cannot say: build libcoda.so with
make and put it inside the package (coda/libcoda.so), where coda/_lib.py
looks for it first after $CODA_LIB."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["make", "-j" + jobs, "lib"], cwd=HERE)
        dest = os.path.join(self.build_lib, "coda")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.join(HERE, "build", "libcoda.so"), os.path.join(dest, "libcoda.so"))


setup(cmdclass={"build_py": BuildWithLibrary})
