# The Firestore database opendws keeps its state in, the composite indexes its queries need,
# and the TTL policy that ages out event records.
#
# Queries (opendws.adapters.firestore):
#   requests where state in [...] order by submitted_at   -> composite index below
#   requests where outbox == true                          -> automatic single-field index
#   usage where tenant == T                                -> automatic single-field index
#   requests/{id}/events order by seq                      -> automatic single-field index
#   requests where changed_at >= T order by changed_at     -> automatic single-field index
#   requests order by changed_at desc limit 1              -> automatic single-field index
#   collection group ranks where vm == V                   -> field override below
# changed_at (every write's commit time) is what the reconciler reads changes by. A collection
# with an indexed, sequentially increasing field takes at most 500 writes per second
# (firestore/docs/best-practices, "Index exemptions"); requests already index submitted_at and
# updated_at, and the scheduler writes far below that rate.

resource "google_firestore_database" "this" {
  project                           = var.project
  name                              = "(default)" # the Firestore client's default database
  location_id                       = var.location
  type                              = "FIRESTORE_NATIVE"
  concurrency_mode                  = "PESSIMISTIC" # the reconciler's fenced transactions
  app_engine_integration_mode       = "DISABLED"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  delete_protection_state           = var.deletion_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"
  deletion_policy                   = var.deletion_protection ? "ABANDON" : "DELETE"
}

# RequestStore.in_states: the pending, booked and running requests in submission order.
resource "google_firestore_index" "requests_by_state_and_submission" {
  project     = var.project
  database    = google_firestore_database.this.name
  collection  = "requests"
  query_scope = "COLLECTION"

  fields {
    field_path = "state"
    order      = "ASCENDING"
  }

  fields {
    field_path = "submitted_at"
    order      = "ASCENDING"
  }
}

# Event records (requests/{id}/events/{seq}) carry expire_at = their time + 400 days, longer
# than any request lives; Firestore deletes them some time after that. The field is never
# queried, so it is also exempt from indexing (a monotonic timestamp index is a write hotspot).
resource "google_firestore_field" "event_expiry" {
  project    = var.project
  database   = google_firestore_database.this.name
  collection = "events"
  field      = "expire_at"

  ttl_config {}

  index_config {}
}

# The agents' rank documents (requests/{id}/ranks/{rank}) are found by their VM's name across
# every request (a CI job's webhook names the runner, which is named after its VM): an
# equality query on vm in the ranks collection group. Single-field indexes of collection-group
# scope are not kept by default (firestore/docs/query-data/index-overview, "Single-field
# indexes"); this field's is, as magic-modules' firestore_field example declares one
# (index_config.indexes with query_scope COLLECTION_GROUP).
resource "google_firestore_field" "rank_vm" {
  project    = var.project
  database   = google_firestore_database.this.name
  collection = "ranks"
  field      = "vm"

  index_config {
    indexes {
      order       = "ASCENDING"
      query_scope = "COLLECTION_GROUP"
    }
  }
}
