//! SIGHUP: re-read the config, apply what may change live, keep the rest.

use super::books::Decider;
use super::context::Daemon;
use super::live::Live;
use crate::config::Config;
use crate::placement::PlacementRule;
use crate::policy_choice::build as build_policy;

impl Daemon {
    /// SIGHUP: re-reads the config; applies what can change live as one new
    /// [`Live`] snapshot and the [`Decider`] built from it, installed in
    /// one step; keeps the old ones when the new config is invalid.
    pub async fn reload(&self) {
        let new = match Config::load(&self.settings.path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("SIGHUP: new config rejected, keeping the old one: {e}");
                return;
            }
        };
        let old = self.settings.current().config.clone();
        let models = self.books.models();
        let policy = match build_policy(&new.policy, &models) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("SIGHUP: policy rejected, keeping the old config: {e}");
                return;
            }
        };
        let fallback = match super::start::shadow_fallback(&new, &models) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("SIGHUP: shadow.fallback rejected, keeping the old config: {e}");
                return;
            }
        };
        let placement = match PlacementRule::build(&new.placement, &models) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("SIGHUP: placement rejected, keeping the old config: {e}");
                return;
            }
        };
        // Keep the restart-only keys as they are.
        let (merged, restart) = old.reloaded(&new);
        if !restart.is_empty() {
            tracing::warn!(
                "SIGHUP: {} changed but need a restart; the old values stay in effect",
                restart.join(", ")
            );
        }
        let live = old.live_changes(&merged);
        if live.is_empty() {
            tracing::info!("SIGHUP: configuration reloaded, nothing changed");
        } else {
            tracing::info!("SIGHUP: configuration reloaded: {}", live.join("; "));
        }
        // One step: readers see the old settings and decider or the new
        // ones, never a mix.
        let decider = Decider::new(policy, fallback, placement);
        self.books
            .install(decider, || self.settings.replace(Live::new(merged)));
    }
}
