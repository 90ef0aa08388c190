//! Writing the actor as an ONNX graph with `onnx-rs` (no Python, no protoc).
//!
//! The graph is the smallest one ONNX Runtime optimises well: `Gemm`
//! (`transB = 1`, because candle stores weights as `[out, in]`), `Relu`,
//! then the mask arithmetic `logits + (mask - 1) * 1e9` (`Sub`, `Mul`, `Add`)
//! and a `Softmax` over the last axis. The batch dimension is symbolic, so
//! one session serves any number of GPUs.

use onnx_rs::ast::{
    Attribute, AttributeType, DataType, Dimension, Graph, Model, Node, OpType, OperatorSetId,
    StringStringEntry, TensorProto, TensorShape, TensorShapeDimension, TensorTypeProto, TypeProto,
    TypeValue, ValueInfo,
};

use crate::formats::policy_file::{
    INPUT_MASK, INPUT_OBS, IR_VERSION, MASK_PENALTY, OPSET, OUTPUT_LOGITS, OUTPUT_PROBS,
};

fn float_input<'a>(name: &'a str, width: usize) -> ValueInfo<'a> {
    ValueInfo {
        name,
        r#type: Some(TypeProto {
            value: Some(TypeValue::Tensor(TensorTypeProto {
                elem_type: DataType::Float,
                shape: Some(TensorShape {
                    dim: vec![
                        TensorShapeDimension {
                            value: Dimension::Param("batch"),
                            ..Default::default()
                        },
                        TensorShapeDimension {
                            value: Dimension::Value(width as i64),
                            ..Default::default()
                        },
                    ],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node<'a>(op: OpType<'a>, name: &'a str, input: Vec<&'a str>, output: Vec<&'a str>) -> Node<'a> {
    Node {
        input,
        output,
        name,
        op_type: op,
        ..Default::default()
    }
}

/// Serialises an MLP policy: `layers` are (weight `[out, in]` row-major,
/// bias, out, in), ReLU between layers, the last layer's output is the
/// unmasked logits.
pub fn mlp_policy_onnx(
    layers: &[(Vec<f32>, Vec<f32>, usize, usize)],
    metadata: &[(&str, &str)],
) -> Vec<u8> {
    let last = layers.len().saturating_sub(1);
    let obs_dim = layers.first().map_or(0, |l| l.3);
    let actions = layers.last().map_or(0, |l| l.2);
    // Every name the graph uses, owned here so the AST can borrow them.
    let names: Vec<[String; 5]> = (0..layers.len())
        .map(|i| {
            [
                format!("w{i}"),
                format!("b{i}"),
                format!("gemm{i}"),
                format!("h{i}"),
                format!("relu{i}"),
            ]
        })
        .collect();
    let mut nodes = Vec::new();
    let mut initializer = Vec::new();
    let mut prev: &str = INPUT_OBS;
    for (i, (w, b, out, inp)) in layers.iter().enumerate() {
        let [wn, bn, gn, hn, rn] = &names[i];
        initializer.push(TensorProto::from_f32(
            wn,
            vec![*out as i64, *inp as i64],
            w.clone(),
        ));
        initializer.push(TensorProto::from_f32(bn, vec![*out as i64], b.clone()));
        let out_name: &str = if i == last { "raw_logits" } else { hn };
        let mut gemm = node(OpType::Gemm, gn, vec![prev, wn, bn], vec![out_name]);
        gemm.attribute.push(Attribute {
            name: "transB",
            r#type: AttributeType::Int,
            i: 1,
            ..Default::default()
        });
        nodes.push(gemm);
        if i != last {
            nodes.push(node(OpType::Relu, rn, vec![hn], vec![rn]));
            prev = rn;
        }
    }
    initializer.push(TensorProto::from_f32("one", vec![], vec![1.0]));
    initializer.push(TensorProto::from_f32("penalty", vec![], vec![MASK_PENALTY]));
    nodes.push(node(
        OpType::Sub,
        "mask_minus_one",
        vec![INPUT_MASK, "one"],
        vec!["mask_m1"],
    ));
    nodes.push(node(
        OpType::Mul,
        "mask_penalty",
        vec!["mask_m1", "penalty"],
        vec!["mask_pen"],
    ));
    nodes.push(node(
        OpType::Add,
        "apply_mask",
        vec!["raw_logits", "mask_pen"],
        vec![OUTPUT_LOGITS],
    ));
    let mut softmax = node(
        OpType::Softmax,
        "softmax",
        vec![OUTPUT_LOGITS],
        vec![OUTPUT_PROBS],
    );
    softmax.attribute.push(Attribute {
        name: "axis",
        r#type: AttributeType::Int,
        i: -1,
        ..Default::default()
    });
    nodes.push(softmax);

    let model = Model {
        ir_version: IR_VERSION,
        opset_import: vec![OperatorSetId {
            domain: "",
            version: OPSET,
        }],
        producer_name: "smartmig",
        producer_version: env!("CARGO_PKG_VERSION"),
        doc_string: "smartmig mean-field repartitioning policy (actor): obs[n,D], mask[n,A] -> logits, probs",
        graph: Some(Graph {
            node: nodes,
            name: "smartmig_policy",
            initializer,
            input: vec![float_input(INPUT_OBS, obs_dim), float_input(INPUT_MASK, actions)],
            output: vec![
                float_input(OUTPUT_LOGITS, actions),
                float_input(OUTPUT_PROBS, actions),
            ],
            ..Default::default()
        }),
        metadata_props: metadata
            .iter()
            .map(|&(key, value)| StringStringEntry { key, value })
            .collect(),
        ..Default::default()
    };
    onnx_rs::encode(&model)
}
