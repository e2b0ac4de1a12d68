"""``import dask_research.replay`` needs neither torch nor CuPy."""
import subprocess
import sys
import textwrap


def test_import_without_torch_or_cupy():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('torch', 'cupy'):
                    raise ImportError('blocked ' + name)
        sys.meta_path.insert(0, Block())
        import numpy as np
        from dask_research import replay
        p = replay.ExperiencePlane({'x': ((2,), 'float32')}, capacity=10, seed=0)
        p.ingest({'x': np.ones((4, 2))})
        with p.batches(batch_size=2, prefetch=1, max_batches=2) as it:
            assert len(list(it)) == 2
        try:
            p.batches(to='torch')
        except ImportError:
            print('torch refused cleanly')
        assert 'torch' not in sys.modules and 'cupy' not in sys.modules
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout and "torch refused cleanly" in out.stdout
