// Validation of sync {}: how sites exchange updates (Gaia, DiLoCo, the
// topology), the compression of what they send, and SkewScout.

#include <string>
#include <string_view>

#include "config/validate.h"
#include "meridian/wan/units.h"

namespace meridian::config_internal {

namespace {

void ValidateCompression(const pb::CompressionConfig& compression,
                         const IssueReporter& r) {
  r.Specified("selection", compression.selection());
  r.Real("top_k_fraction", compression.top_k_fraction(), kFraction);
  r.Specified("index_coding", compression.index_coding());
  r.Specified("value_coding", compression.value_coding());
  r.Check(compression.index_coding() != pb::INDEX_DENSE ||
              compression.value_coding() != pb::VALUE_INT2,
          "index_coding",
          "INDEX_DENSE cannot carry VALUE_INT2, which has no zero level "
          "(every unselected element would arrive as +-s/3): use INDEX_AUTO, "
          "INDEX_DELTA_VARINT or INDEX_BITMAP");
  r.Count("block_size", compression.block_size(), kBlockSize);
  r.Specified("rounding", compression.rounding());
  r.Check(compression.zstd_level() >= 0 && compression.zstd_level() <= 22,
          "zstd_level",
          "must be in [0, 22] (0: no zstd stage), got " +
              std::to_string(compression.zstd_level()));
}

// A site name used by the sync topology: it must name a site with a server.
void CheckTopologySite(const pb::JobConfig& config, const std::string& name,
                       std::string_view field, const IssueReporter& r) {
  Result<int> site = FindSite(config, name);
  if (!site.ok()) {
    r.Report(field, site.status().message());
  } else {
    r.Check(HasServer(config.site(*site)), field,
            "site '" + name +
                "' runs no site server (server_site is set), so it takes no "
                "part in the sync");
  }
}

// SkewScout's options (skew_control.h states the same ranges); it moves
// Gaia's threshold, a top-k density or the averaging period (SkewKnobOf),
// which must start inside its bounds.
void ValidateSkewScout(const pb::SyncConfig& sync, const IssueReporter& r) {
  const pb::SkewScoutConfig& scout = sync.skewscout();
  constexpr CountRange kHoldout{1, 100000};
  r.Count("travel_period", scout.travel_period(), kAtLeastOne);
  r.Count("holdout_samples", scout.holdout_samples(), kHoldout);
  r.Real("target_loss", scout.target_loss(), kOpenUnit);
  r.Real("dead_band", scout.dead_band(), kHalfOpenUnit);
  r.Real("smoothing", scout.smoothing(), kFraction);
  r.Real("tighten_factor", scout.tighten_factor(), kAboveOne);
  r.Real("loosen_factor", scout.loosen_factor(), kAboveOne);
  r.Count("patience", scout.patience(), kAtLeastOne);
  r.Real("min_theta", scout.min_theta(), kPositive);
  r.Real("max_theta", scout.max_theta(), kPositive);
  r.Real("significance_z", scout.significance_z(), kNonNegative);
  r.Specified("travel_value_coding", scout.travel_value_coding());
  if (scout.max_travel_period() != 0) {
    r.Check(scout.max_travel_period() >= scout.travel_period(),
            "max_travel_period",
            "must be 0 (8 x travel_period) or at least travel_period (" +
                std::to_string(scout.travel_period()) + "), got " +
                std::to_string(scout.max_travel_period()));
  }
  if (std::isfinite(scout.min_theta()) && std::isfinite(scout.max_theta())) {
    r.Check(scout.min_theta() <= scout.max_theta(), "max_theta",
            "must be at least min_theta (" + FormatReal(scout.min_theta()) +
                "), got " + FormatReal(scout.max_theta()));
  }
  r.Real("min_density", scout.min_density(), kFraction);
  r.Real("max_density", scout.max_density(), kFraction);
  if (std::isfinite(scout.min_density()) &&
      std::isfinite(scout.max_density())) {
    r.Check(scout.min_density() <= scout.max_density(), "max_density",
            "must be at least min_density (" + FormatReal(scout.min_density()) +
                "), got " + FormatReal(scout.max_density()));
  }
  r.Count("min_averaging_period", scout.min_averaging_period(), kAtLeastOne);
  r.Count("max_averaging_period", scout.max_averaging_period(), kAtLeastOne);
  r.Check(scout.min_averaging_period() <= scout.max_averaging_period(),
          "max_averaging_period",
          "must be at least min_averaging_period (" +
              std::to_string(scout.min_averaging_period()) + "), got " +
              std::to_string(scout.max_averaging_period()));
  if (!scout.enabled()) return;
  r.Check(sync.kind() == pb::GAIA || sync.kind() == pb::MODEL_AVERAGING ||
              sync.kind() == pb::DILOCO,
          "enabled",
          "SkewScout moves Gaia's threshold, a top-k density or the "
          "averaging period: it needs sync.kind GAIA, MODEL_AVERAGING or "
          "DILOCO, got " +
              pb::SyncKind_Name(sync.kind()));
  if (SkewKnobOf(sync) == SkewKnob::kAveragingPeriod) {
    r.Check(sync.kind() != pb::DILOCO || sync.diloco().fragments() <= 1,
            "enabled",
            "moves the averaging period, which the staggered rounds of "
            "sync.diloco.fragments > 1 cannot follow: use one fragment");
    r.Check(sync.averaging_period() >= scout.min_averaging_period() &&
                sync.averaging_period() <= scout.max_averaging_period(),
            "enabled",
            "the controller starts at sync.averaging_period (" +
                std::to_string(sync.averaging_period()) +
                "), which must lie in [" +
                std::to_string(scout.min_averaging_period()) + ", " +
                std::to_string(scout.max_averaging_period()) +
                "] (min_averaging_period, max_averaging_period)");
    return;
  }
  const bool density = SkewKnobOf(sync) == SkewKnob::kTopKDensity;
  const double knob =
      density ? sync.compression().top_k_fraction() : sync.threshold();
  const double low = density ? scout.min_density() : scout.min_theta();
  const double high = density ? scout.max_density() : scout.max_theta();
  if (std::isfinite(knob) && std::isfinite(low) && std::isfinite(high)) {
    r.Check(
        knob >= low && knob <= high, "enabled",
        std::string("the controller starts at ") +
            (density ? "sync.compression.top_k_fraction" : "sync.threshold") +
            " (" + FormatReal(knob) + "), which must lie in [" +
            FormatReal(low) + ", " + FormatReal(high) + "] (" +
            (density ? "min_density, max_density" : "min_theta, max_theta") +
            ")");
  }
}

void ValidateDiLoCo(const pb::SyncConfig& sync, const IssueReporter& r) {
  const pb::DiLoCoConfig& diloco = sync.diloco();
  r.Real("outer_lr", diloco.outer_lr(), kPositive);
  r.Real("outer_momentum", diloco.outer_momentum(), kMomentum);
  r.Count("fragments", diloco.fragments(), kAtLeastOne);
  r.Real("error_feedback_decay", diloco.error_feedback_decay(),
         kUnitInterval);
  r.Check(!diloco.error_feedback() || sync.kind() == pb::DILOCO,
          "error_feedback",
          "applies to sync.kind DILOCO only (MODEL_AVERAGING sends models)");
  if (diloco.fragments() > 0 && sync.averaging_period() > 0) {
    r.Check(sync.averaging_period() % diloco.fragments() == 0, "fragments",
            "must divide sync.averaging_period (" +
                std::to_string(sync.averaging_period()) +
                "): the fragments' rounds are staggered by period / "
                "fragments clocks, got " +
                std::to_string(diloco.fragments()));
  }
}

}  // namespace

void ValidateSync(const pb::JobConfig& config, const IssueReporter& r) {
  const pb::SyncConfig& sync = config.sync();
  r.Specified("kind", sync.kind());
  r.Real("threshold", sync.threshold(), kNonNegative);
  r.Specified("threshold_mode", sync.threshold_mode());
  r.Specified("threshold_schedule", sync.threshold_schedule());
  r.Real("adaptive_step", sync.adaptive_step(), kPositive);
  r.Real("adaptive_max", sync.adaptive_max(), kNonNegative);
  if (sync.adaptive_threshold() && std::isfinite(sync.adaptive_max()) &&
      std::isfinite(sync.threshold())) {
    r.Check(sync.adaptive_max() >= sync.threshold(), "adaptive_max",
            "must be at least threshold (" + FormatReal(sync.threshold()) +
                "), got " + FormatReal(sync.adaptive_max()));
  }
  r.Real("selective_barrier_fraction", sync.selective_barrier_fraction(),
         kUnitInterval);
  r.Real("send_period_s", sync.send_period_s(), kNonNegative);
  r.Check(sync.send_period_s() == 0 || sync.kind() == pb::GAIA ||
              sync.kind() == pb::DENSE,
          "send_period_s",
          "applies to GAIA and DENSE only (MODEL_AVERAGING and DILOCO send "
          "in rounds)");
  r.Specified("own_changes", sync.own_changes());
  const bool held = sync.own_changes() == pb::OWN_CHANGES_WITH_PEERS ||
                    sync.own_changes() == pb::OWN_CHANGES_AS_SENT;
  r.Check(!held || sync.kind() == pb::GAIA || sync.kind() == pb::DENSE,
          "own_changes",
          pb::OwnChanges_Name(sync.own_changes()) +
              " applies to GAIA and DENSE only (MODEL_AVERAGING and DILOCO "
              "apply every site's change together at each outer step "
              "already)");
  r.Check(sync.own_changes() != pb::OWN_CHANGES_AS_SENT ||
              sync.topology() == pb::FULL_MESH,
          "own_changes",
          "OWN_CHANGES_AS_SENT needs topology FULL_MESH (what a hub sends "
          "includes the changes it relays)");
  if (sync.has_bandwidth_budget()) {
    Result<double> budget = wan::ParseBandwidth(sync.bandwidth_budget());
    if (!budget.ok()) {
      r.Report("bandwidth_budget", budget.status().message());
    } else {
      r.Check(*budget > 0, "bandwidth_budget",
              "must be a positive rate such as \"50mbit\"");
    }
  }
  r.Count("averaging_period", sync.averaging_period(), kAtLeastOne);
  ValidateDiLoCo(sync, r.Nested("diloco"));
  ValidateSkewScout(sync, r.Nested("skewscout"));
  ValidateCompression(sync.compression(), r.Nested("compression"));
  r.Specified("topology", sync.topology());
  if (sync.kind() == pb::DILOCO || sync.kind() == pb::MODEL_AVERAGING) {
    r.Check(sync.topology() == pb::FULL_MESH, "topology",
            "sync.kind " + pb::SyncKind_Name(sync.kind()) +
                " averages every site's outer gradient at every site: it "
                "needs FULL_MESH");
  }
  if (sync.topology() == pb::STAR) {
    CheckTopologySite(config, sync.hub(), "hub", r);
  }
  if (sync.topology() != pb::GROUPS) {
    r.Check(sync.group_size() == 0, "group",
            "groups are only used by topology: GROUPS");
    return;
  }
  r.Check(sync.group_size() > 0, "group",
          "topology GROUPS needs at least one group { hub: ... site: ... }");
  std::map<std::string, std::string> placed;  // site -> where it was placed
  auto place = [&](const std::string& site, const std::string& where,
                   std::string_view field, const IssueReporter& g) {
    const auto [it, inserted] = placed.emplace(site, where);
    g.Check(inserted, field,
            "site '" + site + "' is already in " + it->second +
                "; every site belongs to exactly one group");
  };
  for (int i = 0; i < sync.group_size(); ++i) {
    const pb::SiteGroup& group = sync.group(i);
    const IssueReporter g = r.Nested("group", i);
    const std::string where = Indexed("group", i);
    CheckTopologySite(config, group.hub(), "hub", g);
    place(group.hub(), where, "hub", g);
    for (int j = 0; j < group.site_size(); ++j) {
      CheckTopologySite(config, group.site(j), Indexed("site", j), g);
      place(group.site(j), where, Indexed("site", j), g);
    }
  }
  for (const pb::SiteConfig& site : config.site()) {
    if (HasServer(site) && !placed.contains(site.name())) {
      r.Report("group", "site '" + site.name() + "' is in no group");
    }
  }
}

}  // namespace meridian::config_internal
