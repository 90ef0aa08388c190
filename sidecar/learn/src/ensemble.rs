//! Ensembles of exported policies: several actors trained with different
//! seeds, merged into one ONNX actor that acts on the mean of their logits.
//!
//! Why: one training run's checkpoint is picked on a few validation days,
//! and runs that differ only in their seed disagree by several percent on
//! the yardstick (docs/policy.md, "An ensemble of seeds"). Averaging the
//! members' logits keeps what they agree on and damps what one seed
//! learned by chance.
//!
//! How: the mean of K three-layer ReLU MLPs is itself a three-layer ReLU
//! MLP, K times wider, so the merged file is an ordinary policy file (same
//! graph, same inputs and outputs; the daemon and the simulator run it
//! unchanged):
//!
//! - layer 1 stacks the members' first layers (`[K h, D]`);
//! - layer 2 is block diagonal (each member's hidden units see only its
//!   own first layer);
//! - layer 3 puts the members' last layers side by side, each scaled by
//!   `1 / K`, with the mean of their biases.
//!
//! The cost of a decision grows with the width (K^2 for layer 2), still
//! microseconds per GPU (`smartmig bench policy`).

use onnx_rs::ast::OpType;

/// One dense layer as the exporter writes it: (weights `[out, in]`
/// row-major, bias, out, in), see [`super::export::mlp_policy_onnx`].
pub type Layer = (Vec<f32>, Vec<f32>, usize, usize);

/// Why policies could not be read back or merged.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EnsembleError {
    #[error("not an ONNX model: {0}")]
    Parse(String),
    #[error("not a smartmig actor: {0}")]
    Graph(String),
    #[error("an ensemble needs at least two members, got {0}")]
    TooFew(usize),
    #[error("member {member} has layers {got}, member 0 has {expected}: members must share observation, depth and actions")]
    Shape {
        member: usize,
        expected: String,
        got: String,
    },
}

/// Reads the dense layers of an actor written by
/// [`super::export::mlp_policy_onnx`]: its `Gemm` nodes in graph order,
/// each with its weight and bias initialisers.
pub fn read_actor(bytes: &[u8]) -> Result<Vec<Layer>, EnsembleError> {
    let model = onnx_rs::parse(bytes).map_err(|e| EnsembleError::Parse(e.to_string()))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| EnsembleError::Graph("the model has no graph".into()))?;
    let tensor = |name: &str| {
        graph
            .initializer
            .iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| EnsembleError::Graph(format!("initialiser `{name}` is missing")))
    };
    let mut layers = Vec::new();
    for gemm in graph.node.iter().filter(|n| n.op_type == OpType::Gemm) {
        let [_, w, b] = gemm.input.as_slice() else {
            return Err(EnsembleError::Graph(format!(
                "Gemm `{}` has {} inputs, expected 3",
                gemm.name,
                gemm.input.len()
            )));
        };
        let (w, b) = (tensor(w)?, tensor(b)?);
        let &[out, inp] = w.dims() else {
            return Err(EnsembleError::Graph(format!(
                "weight `{}` is not a matrix",
                w.name()
            )));
        };
        let (out, inp) = (out as usize, inp as usize);
        let weights = w.as_f32().map(std::borrow::Cow::into_owned);
        let bias = b.as_f32().map(std::borrow::Cow::into_owned);
        match (weights, bias) {
            (Some(wv), Some(bv)) if wv.len() == out * inp && bv.len() == out => {
                layers.push((wv, bv, out, inp));
            }
            _ => {
                return Err(EnsembleError::Graph(format!(
                "Gemm `{}`: weights or bias are not float data of shape [{out}, {inp}] and [{out}]",
                gemm.name
            )))
            }
        }
    }
    if layers.len() != 3 {
        return Err(EnsembleError::Graph(format!(
            "{} dense layers, expected 3",
            layers.len()
        )));
    }
    Ok(layers)
}

fn shape_of(layers: &[Layer]) -> String {
    layers
        .iter()
        .map(|l| format!("[{}x{}]", l.2, l.3))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The one MLP whose logits are the mean of the members' (module docs).
/// Members may differ in hidden width, not in inputs, depth or outputs.
pub fn merge(members: &[Vec<Layer>]) -> Result<Vec<Layer>, EnsembleError> {
    if members.len() < 2 {
        return Err(EnsembleError::TooFew(members.len()));
    }
    let first = &members[0];
    let (inputs, actions) = (first[0].3, first[2].2);
    for (k, m) in members.iter().enumerate() {
        let chained = m.len() == 3 && m[1].3 == m[0].2 && m[2].3 == m[1].2;
        if !chained || m[0].3 != inputs || m[2].2 != actions {
            return Err(EnsembleError::Shape {
                member: k,
                expected: shape_of(first),
                got: shape_of(m),
            });
        }
    }
    let h1: usize = members.iter().map(|m| m[0].2).sum();
    let h2: usize = members.iter().map(|m| m[1].2).sum();
    let k = members.len() as f32;
    let mut w1 = Vec::with_capacity(h1 * inputs);
    let mut b1 = Vec::with_capacity(h1);
    let mut w2 = vec![0.0f32; h2 * h1];
    let mut b2 = Vec::with_capacity(h2);
    let mut w3 = vec![0.0f32; actions * h2];
    let mut b3 = vec![0.0f32; actions];
    let (mut row, mut col) = (0, 0);
    for m in members {
        let (l1, l2, l3) = (&m[0], &m[1], &m[2]);
        w1.extend_from_slice(&l1.0);
        b1.extend_from_slice(&l1.1);
        // Layer 2: member block at rows row.., columns col.. (its layer-1 units).
        for r in 0..l2.2 {
            let dst = (row + r) * h1 + col;
            w2[dst..dst + l2.3].copy_from_slice(&l2.0[r * l2.3..(r + 1) * l2.3]);
        }
        b2.extend_from_slice(&l2.1);
        // Layer 3: member columns row.. (its layer-2 units), scaled by 1/K.
        for a in 0..actions {
            for c in 0..l3.3 {
                w3[a * h2 + row + c] = l3.0[a * l3.3 + c] / k;
            }
            b3[a] += l3.1[a] / k;
        }
        row += l2.2;
        col += l1.2;
    }
    Ok(vec![
        (w1, b1, h1, inputs),
        (w2, b2, h2, h1),
        (w3, b3, actions, h2),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The unmasked logits of `layers` for one observation (ReLU between
    /// layers): the reference the merge is tested against.
    fn logits(layers: &[Layer], obs: &[f32]) -> Vec<f32> {
        let last = layers.len().saturating_sub(1);
        layers
            .iter()
            .enumerate()
            .fold(obs.to_vec(), |x, (i, (w, b, out, inp))| {
                (0..*out)
                    .map(|o| {
                        let y = b[o] + (0..*inp).map(|j| w[o * inp + j] * x[j]).sum::<f32>();
                        if i == last {
                            y
                        } else {
                            y.max(0.0)
                        }
                    })
                    .collect()
            })
    }

    fn random_mlp(rng: &mut ChaCha8Rng, d: usize, h: usize, a: usize) -> Vec<Layer> {
        let mut dense = |out: usize, inp: usize| {
            let w = (0..out * inp)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let b = (0..out).map(|_| rng.random_range(-0.5..0.5)).collect();
            (w, b, out, inp)
        };
        vec![dense(h, d), dense(h, h), dense(a, h)]
    }

    #[test]
    fn the_merged_network_acts_on_the_mean_of_the_members_logits() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (d, a) = (7, 5);
        let members = vec![
            random_mlp(&mut rng, d, 4, a),
            random_mlp(&mut rng, d, 6, a),
            random_mlp(&mut rng, d, 4, a),
        ];
        let merged = merge(&members).unwrap();
        assert_eq!(shape_of(&merged), "[14x7] [14x14] [5x14]");
        for _ in 0..50 {
            let obs: Vec<f32> = (0..d).map(|_| rng.random_range(-2.0..2.0)).collect();
            let got = logits(&merged, &obs);
            let each: Vec<Vec<f32>> = members.iter().map(|m| logits(m, &obs)).collect();
            for (act, g) in got.iter().enumerate() {
                let mean = each.iter().map(|l| l[act]).sum::<f32>() / 3.0;
                assert!((g - mean).abs() < 1e-4, "{g} vs {mean}");
            }
        }
    }

    #[test]
    fn an_exported_actor_reads_back_unchanged() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let layers = random_mlp(&mut rng, 9, 8, 3);
        let bytes = super::super::export::mlp_policy_onnx(&layers, &[("k", "v")]);
        assert_eq!(read_actor(&bytes).unwrap(), layers);
    }

    #[test]
    fn members_that_do_not_fit_together_are_refused() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let a = random_mlp(&mut rng, 7, 4, 5);
        assert_eq!(
            merge(std::slice::from_ref(&a)),
            Err(EnsembleError::TooFew(1))
        );
        let other_inputs = random_mlp(&mut rng, 8, 4, 5);
        assert!(matches!(
            merge(&[a.clone(), other_inputs]),
            Err(EnsembleError::Shape { member: 1, .. })
        ));
        let other_actions = random_mlp(&mut rng, 7, 4, 6);
        assert!(matches!(
            merge(&[a, other_actions]),
            Err(EnsembleError::Shape { member: 1, .. })
        ));
        assert!(matches!(
            read_actor(b"not onnx"),
            Err(EnsembleError::Parse(_) | EnsembleError::Graph(_))
        ));
    }
}
