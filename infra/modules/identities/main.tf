# One service account per function, plus the two identities that call functions (the Eventarc
# triggers' and the Cloud Tasks timers'), and the project-level roles each one needs. Roles on
# single resources (topics, the queue, secrets, services) are granted by the module that owns
# the resource.

locals {
  project_bindings = merge([
    for key, account in var.accounts : {
      for role in account.project_roles : "${key}/${role}" => { account = key, role = role }
    }
  ]...)
}

resource "google_service_account" "account" {
  for_each = var.accounts

  project      = var.project
  account_id   = each.value.account_id
  display_name = each.value.display_name
  description  = each.value.description
}

resource "google_project_iam_member" "role" {
  for_each = local.project_bindings

  project = var.project
  role    = each.value.role
  member  = "serviceAccount:${google_service_account.account[each.value.account].email}"

  # Firestore roles hold for opendws's database only.
  dynamic "condition" {
    for_each = startswith(each.value.role, "roles/datastore.") ? [var.firestore_database] : []
    content {
      title       = "opendws-database-only"
      description = "Only the database opendws keeps its state in."
      expression  = "resource.name.startsWith(\"projects/${var.project}/databases/${condition.value}\")"
    }
  }
}
