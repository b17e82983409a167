//! Per-GPU device metrics in the style of NVIDIA's DCGM exporter, for a
//! real Prometheus to scrape from the sim.
//!
//! | metric | value |
//! |---|---|
//! | `DCGM_FI_DEV_GPU_UTIL` | 100 while a workload pod holds the GPU, else 0 |
//! | `DCGM_FI_DEV_XID_ERRORS` | 79 (fallen off the bus) on a faulty GPU or under an `-unhealthy` agent, else 0 |
//! | `saferollout_sim_gpu_healthy` | 1 when workloads can use the GPU through every agent of the node, else 0 |
//!
//! Labels: `gpu` (index), `UUID`, `device` (`nvidia<index>`), `modelName`,
//! `Hostname` (the node, as DCGM reports it) and `node` (the same, as a
//! Kubernetes scrape configuration would add it).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::slice::DEVICE_MODEL;

/// One GPU's readings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSample {
    pub node: String,
    pub index: u64,
    pub uuid: String,
    pub healthy: bool,
    pub in_use: bool,
    pub xid: i64,
}

type Labels = Vec<(String, String)>;

fn labels(sample: &GpuSample) -> Labels {
    vec![
        ("gpu".into(), sample.index.to_string()),
        ("UUID".into(), sample.uuid.clone()),
        ("device".into(), format!("nvidia{}", sample.index)),
        ("modelName".into(), DEVICE_MODEL.into()),
        ("Hostname".into(), sample.node.clone()),
        ("node".into(), sample.node.clone()),
    ]
}

/// The Prometheus text exposition of `samples`.
pub fn render<'a>(samples: impl IntoIterator<Item = &'a GpuSample>) -> String {
    let util = Family::<Labels, Gauge>::default();
    let xid = Family::<Labels, Gauge>::default();
    let healthy = Family::<Labels, Gauge>::default();
    for sample in samples {
        let labels = labels(sample);
        util.get_or_create(&labels)
            .set(if sample.in_use { 100 } else { 0 });
        xid.get_or_create(&labels).set(sample.xid);
        healthy
            .get_or_create(&labels)
            .set(i64::from(sample.healthy));
    }
    let mut registry = Registry::default();
    registry.register("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", util);
    registry.register(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered",
        xid,
    );
    registry.register(
        "saferollout_sim_gpu_healthy",
        "1 when workloads can use the GPU through the node's agents, else 0",
        healthy,
    );
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_dcgm_names_and_labels() {
        let samples = [
            GpuSample {
                node: "sim-gpu-0".into(),
                index: 0,
                uuid: "GPU-1".into(),
                healthy: true,
                in_use: true,
                xid: 0,
            },
            GpuSample {
                node: "sim-gpu-0".into(),
                index: 1,
                uuid: "GPU-2".into(),
                healthy: false,
                in_use: false,
                xid: 79,
            },
        ];
        let text = render(&samples);
        assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"), "{text}");
        assert!(
            text.contains(r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",device="nvidia0",modelName="sim-gpu",Hostname="sim-gpu-0",node="sim-gpu-0"} 100"#),
            "{text}"
        );
        assert!(text.contains(r#"DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-2",device="nvidia1",modelName="sim-gpu",Hostname="sim-gpu-0",node="sim-gpu-0"} 79"#), "{text}");
        assert!(text.contains(r#"saferollout_sim_gpu_healthy{gpu="1",UUID="GPU-2",device="nvidia1",modelName="sim-gpu",Hostname="sim-gpu-0",node="sim-gpu-0"} 0"#), "{text}");
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
