"""Stop 29, call 1: AdamW's bias corrections as reciprocals (committed) against
the divisions of stop 28 (restored here), same process, same inputs; and
ping-pong 64x128 tiles for bf16 states."""
import dataclasses, sys
import jax.numpy as jnp
from experiments import bench_fused_dw, probe_mosaic
from forge_jax._src import rules as R

def old_adamw(grad, param, state, hp, count):
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = hp["one_minus_b1"] * grad + b1 * mu
  nu = R._second_moment(grad, nu, hp)
  mu_hat = mu / (1 - b1**count)
  direction = mu_hat / (jnp.sqrt(nu) / jnp.sqrt(1 - b2**count) + hp["eps"])
  return direction + hp["weight_decay"] * param, (mu, nu)

C = probe_mosaic.C
probe_mosaic.CONFIGS["PP_m64n128s4e32"] = C(64, 128, 64, 4, epi_n=32, compute_wgs=2, ping_pong=True)
new = bench_fused_dw.RULES["adamw"]
old = dataclasses.replace(new, direction=old_adamw)
shapes, modes, configs, rounds = sys.argv[1:5]
lines = []
for tag, rule in (("old", old), ("new", new)) * int(rounds):
  bench_fused_dw.RULES["adamw"] = rule
  probe_mosaic.RULES = bench_fused_dw.RULES
  out = probe_mosaic.main(["--shapes", shapes, "--modes", modes, "--configs", configs, "--reps", "20"])
  lines += [f"[{tag}] {l}" for l in out]
print("\n".join(lines))
