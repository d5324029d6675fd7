"""Data-parallel training through any backend: ``ddpbench launch -n 4 -- python
examples/train_mlp.py horovod`` (or mpi, collective, kvstore, p3, byteps)."""

import sys

import ddpbench
from ddpbench import data, nn

kv = ddpbench.create(sys.argv[1] if len(sys.argv) > 1 else "horovod")
ds = data.teacher_student()
model = nn.mlp(num_classes=ds.num_classes, hidden=(64,), seed=kv.rank)  # ranks differ...
ddpbench.broadcast_parameters(model, kv=kv)       # ...until root's values win (deferred too)
trainer = ddpbench.DistributedTrainer(model, ddpbench.SGD(lr=0.1), kv=kv)
loader = data.ShardedLoader(ds.x_train, ds.y_train, 32, rank=kv.rank,
                            num_workers=kv.num_workers)
for step in range(200):
    x, y = loader.batch(step)
    loss, dlogits = nn.softmax_cross_entropy(model(x), y)
    model.backward(dlogits)        # each gradient is pushed as soon as it is produced
    trainer.step(len(x))
if kv.rank == 0:
    print(f"test accuracy {nn.accuracy(model(ds.x_test), ds.y_test):.3f}")
kv.close()
