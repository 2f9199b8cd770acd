# The functions' source: the package that `make -C infra package` builds (functions/main.py,
# the opendws package from shared/, and requirements.txt) in a private bucket, named by its
# content hash so that a changed package redeploys the functions and an unchanged one does not.

resource "google_storage_bucket" "source" {
  project                     = var.project
  name                        = var.bucket_name
  location                    = var.location
  labels                      = var.labels
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true # it holds build inputs only

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      num_newer_versions = 3
      with_state         = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 90
    }
    action {
      type = "Delete"
    }
  }

  dynamic "logging" {
    for_each = var.access_log_bucket == null ? [] : [var.access_log_bucket]
    content {
      log_bucket = logging.value
    }
  }
}

resource "google_storage_bucket_object" "package" {
  name   = "functions/opendws-${filesha256(var.archive)}.zip"
  bucket = google_storage_bucket.source.name
  source = var.archive
}
