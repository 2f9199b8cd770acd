# A dashboard and two alert policies over the metrics each function exports through
# OpenTelemetry's Cloud Monitoring exporter (shared/opendws/ports/telemetry.py is the catalog:
# names, kinds and labels). The exporter writes metric type "<prefix>/<name>", prefix
# workload.googleapis.com by default; counters and histograms are CUMULATIVE, gauges GAUGE.

locals {
  metric = { for name in [
    "opendws_pending_requests",
    "opendws_pending_longest_wait_seconds",
    "opendws_admitted_active_requests",
    "opendws_admitted_requests_total",
    "opendws_admission_wait_time_seconds",
    "opendws_admitted_until_ready_wait_time_seconds",
    "opendws_eta_error_seconds",
    "opendws_timed_out_requests_total",
    "opendws_stockouts_total",
    "opendws_failovers_total",
    "opendws_reconcile_passes_total",
    "opendws_reconcile_pass_duration_seconds",
    "opendws_reconcile_documents_read",
    "opendws_tenant_resource_usage",
    "opendws_tenant_nominal_quota",
    "opendws_accelerator_hours_total",
    "opendws_cost_total",
  ] : name => "metric.type=\"${var.metric_prefix}/${name}\"" }

  # One chart: a line per series, aggregated as given.
  chart = {
    for title, spec in {
      "Pending requests by tenant"            = { metric = "opendws_pending_requests", aligner = "ALIGN_MEAN", reducer = "REDUCE_SUM", by = ["metric.label.tenant"] }
      "Longest wait (s) by tenant"            = { metric = "opendws_pending_longest_wait_seconds", aligner = "ALIGN_MAX", reducer = "REDUCE_MAX", by = ["metric.label.tenant"] }
      "Admissions per minute by pool"         = { metric = "opendws_admitted_requests_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.pool"] }
      "Publish → admission p95 (s) by pool"   = { metric = "opendws_admission_wait_time_seconds", aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", by = ["metric.label.pool"] }
      "Admission → ACTIVE p95 (s) by pool"    = { metric = "opendws_admitted_until_ready_wait_time_seconds", aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", by = ["metric.label.pool"] }
      "ETA error p95 (s), early and late"     = { metric = "opendws_eta_error_seconds", aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", by = ["metric.label.direction"] }
      "Time-outs per minute by tenant"        = { metric = "opendws_timed_out_requests_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.tenant"] }
      "Stockouts per minute by pool"          = { metric = "opendws_stockouts_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.pool"] }
      "Failovers per minute by pool served"   = { metric = "opendws_failovers_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.to_pool"] }
      "Reconcile pass p95 (s)"                = { metric = "opendws_reconcile_pass_duration_seconds", aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", by = ["metric.label.outcome"] }
      "Documents read per pass, p95"          = { metric = "opendws_reconcile_documents_read", aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", by = [] }
      "Quota in use by tenant (accelerators)" = { metric = "opendws_tenant_resource_usage", aligner = "ALIGN_MEAN", reducer = "REDUCE_SUM", by = ["metric.label.tenant", "metric.label.accelerator"] }
      "Nominal quota by tenant"               = { metric = "opendws_tenant_nominal_quota", aligner = "ALIGN_MEAN", reducer = "REDUCE_SUM", by = ["metric.label.tenant", "metric.label.accelerator"] }
      "Accelerator-hours per hour by tenant"  = { metric = "opendws_accelerator_hours_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.tenant"] }
      "Cost per hour by tenant"               = { metric = "opendws_cost_total", aligner = "ALIGN_RATE", reducer = "REDUCE_SUM", by = ["metric.label.tenant"] }
      } : title => {
      title = title
      xyChart = {
        dataSets = [{
          plotType = "LINE"
          timeSeriesQuery = {
            timeSeriesFilter = {
              filter = local.metric[spec.metric]
              aggregation = {
                alignmentPeriod    = "60s"
                perSeriesAligner   = spec.aligner
                crossSeriesReducer = spec.reducer
                groupByFields      = spec.by
              }
            }
          }
        }]
      }
    }
  }
}

resource "google_monitoring_dashboard" "opendws" {
  project = var.project
  dashboard_json = jsonencode({
    displayName = "opendws"
    mosaicLayout = {
      columns = 12
      tiles = [for index, title in sort(keys(local.chart)) : {
        xPos   = (index % 2) * 6
        yPos   = floor(index / 2) * 4
        width  = 6
        height = 4
        widget = local.chart[title]
      }]
    }
  })
}

resource "google_monitoring_alert_policy" "waiting" {
  project               = var.project
  display_name          = "opendws: a request has waited too long"
  combiner              = "OR"
  notification_channels = var.notification_channels
  documentation {
    content   = "A pending request has waited more than ${var.wait_threshold_seconds} s for admission. `dws queue` (or the dashboard) shows why: its reason, ETA and place in line."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "opendws_pending_longest_wait_seconds above ${var.wait_threshold_seconds} s"
    condition_threshold {
      filter          = local.metric["opendws_pending_longest_wait_seconds"]
      comparison      = "COMPARISON_GT"
      threshold_value = var.wait_threshold_seconds
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["metric.label.tenant", "metric.label.pool"]
      }
    }
  }
}

resource "google_monitoring_alert_policy" "reconcile_silent" {
  project               = var.project
  display_name          = "opendws: the reconciler is not running"
  combiner              = "OR"
  notification_channels = var.notification_channels
  documentation {
    content   = "No reconcile pass was recorded for ${var.reconcile_silence_seconds} s: nothing is admitted, provisioned or released. Check the reconcile-tick Cloud Scheduler job and the reconcile function's logs."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "opendws_reconcile_passes_total absent for ${var.reconcile_silence_seconds} s"
    condition_absent {
      filter   = local.metric["opendws_reconcile_passes_total"]
      duration = "${var.reconcile_silence_seconds}s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_RATE"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
}
