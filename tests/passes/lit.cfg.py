# lit configuration of the FileCheck pass tests (tests/passes/*.ngt), run by
# ctest as `lit tests/passes --param normgrad_bin=DIR --param filecheck_dir=DIR
# --param exec_root=DIR`: `normgrad` and `FileCheck` are found on PATH.
import os

import lit.formats

config.name = "normgrad-passes"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".ngt"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = lit_config.params.get("exec_root", os.path.join(config.test_source_root, "Output"))
path = [lit_config.params.get("normgrad_bin", ""), lit_config.params.get("filecheck_dir", ""),
        os.environ.get("PATH", "")]
config.environment["PATH"] = os.pathsep.join(p for p in path if p)
