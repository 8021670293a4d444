import sys, json, numpy as np
sys.path.insert(0, "/work/wt-27-bench3/benchmarks")
import bench_data_cleaning as dc
p = float(sys.argv[1]); budget = float(sys.argv[2])
problem = dc.load_problem(dc.BENCH_DIR / "mnist.pkl", p)
X = problem["X_train"].astype(np.float64); y = problem["y_train"]; yc = problem["y_clean"]
corr = problem["corrupted"]; clean = ~corr
entry = [e for e in dc.best_params(p, ["SRBA"])][0]
z_it, w = dc.peer_solution(entry, p, 1, budget)
np.save(f"/tmp/i27/srba_w_p{p}.npy", w)
sid = 1/(1+np.exp(-np.load(f"/tmp/i27/sid_b0/sid_drop_in_lr1.0_b10.0_p{p}_seed1.npz")["logits"].astype(float)))
out = {"iterate": dc.error(z_it, problem["X_test"], problem["y_test"])}
def ev(name, weights):
    z = dc.fit_weighted(X, y, weights)
    out[name] = dict(test_error=dc.error(z, problem["X_test"], problem["y_test"]), val_loss=dc.val_loss(z, problem["X_val"], problem["y_val"]))
    print(name, out[name], flush=True)
percls_srba = np.array([w[clean & (yc == c)].mean() for c in range(10)])
percls_sid = np.array([sid[clean & (yc == c)].mean() for c in range(10)])
out["per_class_clean_srba"] = percls_srba.round(3).tolist(); out["per_class_clean_sid"] = percls_sid.round(3).tolist()
out["per_class_corr_srba"] = [float(w[corr & (y == c)].mean()) for c in range(10)]
print(out, flush=True)
ev("srba", w)
ev("srba clean, 0 corrupted", np.where(clean, w, 0.0))
ev("1 clean, srba corrupted", np.where(clean, 1.0, w))
ev("srba per-class clean means, 0 corrupted", np.where(clean, percls_srba[yc], 0.0))
ev("srba clean / its mean, 0 corrupted", np.where(clean, w / w[clean].mean(), 0.0))
json.dump(out, open(f"/tmp/i27/decomp_p{p}.json", "w"), indent=1)
