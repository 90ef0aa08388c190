// TEMPORARY experiment (issue 4 engineer): not part of the product.
use smartmig::mig::{Geometry, GpuModel};
use smartmig::policy::*;
use smartmig::sim::*;
use smartmig::workload::*;

struct Init<P>(P, smartmig::mig::Layout);
impl<P: RepartitionPolicy> RepartitionPolicy for Init<P> {
    fn name(&self) -> String { self.0.name() }
    fn initial_layout(&mut self, _g: usize, _geo: &'static Geometry) -> smartmig::mig::Layout { self.1 }
    fn decide(&mut self, v: &ClusterView<'_>) -> Vec<Decision> { self.0.decide(v) }
}

fn main() {
    let m = GpuModel::A100_40gb;
    let cfgw = DiurnalConfig::default();
    let jobs = generate_diurnal(&cfgw, m, 8, 0);
    let cluster = vec![m; 8];
    let cfg = SimConfig { workload_horizon_s: Some(cfgw.horizon_s), ..SimConfig::default() };
    let heur: Heuristic = std::env::args().nth(1).unwrap_or("edf".into()).parse().unwrap();
    let mut h = heur.build(0);
    let r0 = simulate(&cluster, &jobs, h.as_mut(), &mut NoPartition, &cfg, RunHooks::default()).unwrap();
    let g = Geometry::of(m);
    for (i, &l) in g.catalog().iter().enumerate() {
        for w in [0.0, 60.0] {
            let mut p = Init(Greedy::new(GreedyConfig { window_s: w, ..GreedyConfig::default() }), l);
            let mut h = heur.build(0);
            let r = simulate(&cluster, &jobs, h.as_mut(), &mut p, &cfg, RunHooks::default()).unwrap();
            let s = EtScore::new(&r.metrics, &r0.metrics, "none".into(), 1.0);
            let mut st = StaticLayout::parse(&i.to_string(), &[m]).unwrap();
            let mut h = heur.build(0);
            let rs = simulate(&cluster, &jobs, h.as_mut(), &mut st, &cfg, RunHooks::default()).unwrap();
            let ss = EtScore::new(&rs.metrics, &r0.metrics, "none".into(), 1.0);
            println!("{i:2} {:18} w{w:3} greedy ET {:?} E {:.1} T {:.1} late {:.2} rec {} uns {} | static ET {:?} uns {}", g.picture(l), s.et.map(|x| (x*1000.0).round()/1000.0), r.metrics.energy_mj, r.metrics.mean_tardiness_s, r.metrics.late_share, r.metrics.reconfigurations, r.metrics.unserved, ss.et.map(|x| (x*1000.0).round()/1000.0), rs.metrics.unserved);
        }
    }
}
