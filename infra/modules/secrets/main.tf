# The CI hooks' shared secrets, the API's keys and the agents' session key, in Secret Manager. Each secret starts with a
# generated value, so the first apply deploys working functions; rotate by adding a version
# (the functions read the latest at instance start). Generated values are in the Terraform
# state: keep the state in a protected bucket.

locals {
  hook_secrets = {
    github  = "opendws-github-webhook-secret"
    gitlab  = "opendws-gitlab-webhook-token"
    generic = "opendws-hook-secret"
  }
  api_tenants = concat(var.api_tenants, ["admin"])
}

resource "random_password" "hook" {
  for_each = local.hook_secrets

  length  = 48
  special = false
}

resource "random_password" "api_key" {
  for_each = toset(local.api_tenants)

  length  = 40
  special = false
}

resource "google_secret_manager_secret" "hook" {
  for_each = local.hook_secrets

  project   = var.project
  secret_id = each.value
  labels    = var.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "hook" {
  for_each = local.hook_secrets

  secret      = google_secret_manager_secret.hook[each.key].id
  secret_data = random_password.hook[each.key].result

  lifecycle {
    ignore_changes = [secret_data, enabled] # rotated out of band
  }
}

resource "google_secret_manager_secret" "api_keys" {
  project   = var.project
  secret_id = "opendws-api-keys"
  labels    = var.labels

  replication {
    auto {}
  }
}

# OPENDWS_API_KEYS: "tenant:sha256:HEX,…,admin:sha256:HEX" — only each key's SHA-256 digest
# is stored for the api to check against; the keys themselves are the api_keys output.
resource "google_secret_manager_secret_version" "api_keys" {
  secret      = google_secret_manager_secret.api_keys.id
  secret_data = join(",", [for tenant in local.api_tenants : "${tenant}:sha256:${sha256(random_password.api_key[tenant].result)}"])

  lifecycle {
    ignore_changes = [enabled]
  }
}

resource "google_secret_manager_secret_iam_member" "hook_reader" {
  for_each = { for pair in setproduct(keys(local.hook_secrets), var.hook_readers) : "${pair[0]}/${pair[1]}" => pair }

  project   = var.project
  secret_id = google_secret_manager_secret.hook[each.value[0]].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value[1]
}

resource "google_secret_manager_secret_iam_member" "api_keys_reader" {
  for_each = toset(var.api_key_readers)

  project   = var.project
  secret_id = google_secret_manager_secret.api_keys.secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value
}

# OPENDWS_AGENT_SESSION_KEY: the HMAC key the agent function signs each agent's session token
# with (bound to its order, rank and instance id). The reconciler builds the same service for
# its sweep of lost agents, which refuses to start without the key. 48 random letters and digits (the code takes at least 16 bytes).
resource "random_password" "agent_session_key" {
  length  = 48
  special = false
}

resource "google_secret_manager_secret" "agent_session_key" {
  project   = var.project
  secret_id = "opendws-agent-session-key"
  labels    = var.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "agent_session_key" {
  secret      = google_secret_manager_secret.agent_session_key.id
  secret_data = random_password.agent_session_key.result

  lifecycle {
    ignore_changes = [secret_data, enabled] # rotated out of band
  }
}

resource "google_secret_manager_secret_iam_member" "agent_session_key_reader" {
  for_each = toset(var.agent_session_key_readers)

  project   = var.project
  secret_id = google_secret_manager_secret.agent_session_key.secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value
}
