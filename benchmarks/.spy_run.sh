export PYTHONPATH=/tmp/site:src:.
ls /tmp/site/fastapi >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $(ls .whl/*.whl | grep -v py_spy)
ls /tmp/spy/bin/py-spy >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
ls /tmp/ckpt/model.safetensors.index.json >/dev/null 2>&1 || python3 -c "from pathlib import Path; from benchmarks.gpu_checkpoint import build_checkpoint; build_checkpoint(Path('.ext/MiniCPMO45'), Path('/tmp/ckpt'), False, 'cuda')" 2>&1 | tail -2
timeout 400 python3 -m benchmarks.gpu_density --model-path /tmp/ckpt --counts 4,8 --slots 8 --units 14 --chats 0 --out $OUT/gpu_density.json --log $OUT/server.log > $OUT/d.txt 2>&1 &
for i in $(seq 400); do grep -q "^N=4" $OUT/d.txt && break; sleep 1; done
sleep 3
PID=$(grep "\[worker\] uvicorn.error.*Started server process" $OUT/server.log | sed 's/.*process \[\([0-9]*\)\].*/\1/' | tail -1)
echo worker $PID
/tmp/spy/bin/py-spy record --pid $PID -d 12 -r 100 --gil --nonblocking --format raw -o $OUT/spy_gil.txt > $OUT/spy1.log 2>&1 &
/tmp/spy/bin/py-spy record --pid $PID -d 12 -r 100 --nonblocking --format raw -o $OUT/spy_all.txt > $OUT/spy2.log 2>&1 &
wait
grep "^N=" $OUT/d.txt | cut -c1-200; tail -3 $OUT/spy1.log $OUT/spy2.log; wc -l $OUT/spy_*.txt
